#!/usr/bin/env bash
# The main demo: a real training loop (tiny model, synthetic data, slow loader) that writes
# traces, scalars and findings to runs/demo, then summarises them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
rm -rf runs/demo
.venv/bin/python examples/plain_loop.py --logdir runs/demo
.venv/bin/profcallbacks report runs/demo || true
echo
echo "View it: .venv/bin/tensorboard --logdir runs/demo   (open the PYTORCH_PROFILER tab)"
