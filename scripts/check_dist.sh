#!/usr/bin/env bash
# Builds the sdist and the wheel, checks their metadata, installs each in a clean virtualenv and
# runs the smoke test there (import, `profcallbacks --help`, a 20-step loop, a report of it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
.venv/bin/python -m twine check --strict "$work"/dist/*
base=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
"$base" -m venv "$work/venv"
# torch first, from pip's cache: the same pinned build the test environment uses
"$work/venv/bin/python" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
here=$PWD
for artifact in "$work"/dist/*.whl "$work"/dist/*.tar.gz; do  # the sdist replaces the wheel
  "$work/venv/bin/python" -m pip install -q --force-reinstall --no-deps "$artifact"
  "$work/venv/bin/python" -m pip install -q "$artifact"  # its dependencies (rich)
  rm -rf "$work/smoke-run"
  (cd "$work" && "$work/venv/bin/python" "$here/scripts/smoke_test.py" "$work/smoke-run")
  echo "ok: $(basename "$artifact")"
done
