#!/usr/bin/env bash
# Lint, type-check and run the whole test suite in .venv. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
.venv/bin/ruff check src tests examples benchmarks
.venv/bin/mypy src
.venv/bin/python -m pytest -q "$@"
