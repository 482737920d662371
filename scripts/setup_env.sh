#!/usr/bin/env bash
# Creates .venv with torch (pinned CPU build for tests), profcallbacks and its extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.profcallbacks-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # The test environment pins torch 2.13.0 (CPU); the package itself accepts a range.
  .venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
  .venv/bin/python -m pip install -q -e ".[dev]"
  touch "$stamp"
fi
