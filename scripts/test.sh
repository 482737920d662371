#!/usr/bin/env bash
# Lint, type-check and run the whole test suite in .venv. Extra arguments go to pytest.
#   scripts/test.sh --fast   lint and the fast lane only (pytest -m fast: the pure-logic tests,
#                            about half of them, in a minute or two; no type check)
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
if [[ "${1:-}" == "--fast" ]]; then
    fast=1
    shift
fi
scripts/setup_env.sh
.venv/bin/ruff check src tests examples benchmarks
if (( fast )); then
    exec .venv/bin/python -m pytest -q -m fast "$@"
fi
.venv/bin/mypy src
.venv/bin/python -m pytest -q "$@"
