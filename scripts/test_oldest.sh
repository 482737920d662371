#!/usr/bin/env bash
# The front-end tests against the OLDEST declared version of every dependency: constraints/oldest.txt
# (pyproject.toml's lower bounds, torch 2.13.0 included, plus the pins those old releases need) in
# .venv-oldest (profcallbacks editable). The main suite (scripts/test.sh) runs the newest releases.
# If the package registry cannot be reached the script skips; a failed install or test fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-oldest
CONSTRAINTS=constraints/oldest.txt
# What the oldest versions touch: Lightning (and its CLI example), the HF Trainer, all three front ends
# against one scenario, the TensorBoard logger and profiler plugin, W&B and MLflow, the report and
# compare CLI (orjson/msgspec readers), `watch` (rich), the docs' code examples, notebook re-runs.
TESTS=(
  tests/test_lightning.py
  tests/test_hf.py
  tests/test_contract.py
  tests/test_front_ends.py
  tests/test_sync_frameworks.py
  tests/test_memory_frameworks.py
  tests/test_slowdown_frameworks.py
  tests/test_tensorboard_plugin.py
  tests/test_trackers.py
  tests/test_report.py
  tests/test_report_decode.py
  tests/test_watch.py
  tests/test_faults_reruns.py
  tests/test_docs.py
)
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
start=$(date +%s)
if ! "$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" -e ".[all,wandb,mlflow]" \
      "jsonargparse[signatures]" pytest pytest-timeout; then
  probe=$(mktemp -d)
  if ! "$VENV/bin/python" -m pip download -q --no-deps --no-cache-dir -d "$probe" "rich==13.0.0"; then
    rm -rf "$probe"
    echo "oldest-versions tests skipped: the package registry could not be reached"
    exit 0
  fi
  rm -rf "$probe"
  echo "oldest-versions install failed: $CONSTRAINTS cannot be installed together" >&2
  exit 1
fi
# Every pin of the constraints file holds for what got installed (a pin pip dropped would let the
# tests run on a newer release without saying so).
"$VENV/bin/python" - "$CONSTRAINTS" <<'EOF'
import re
import sys
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet

pins = [m.groups() for m in map(re.compile(r"([A-Za-z0-9_.-]+)([<>=!][^\s#]*)").match, open(sys.argv[1])) if m]
wrong = []
for name, spec in pins:
    try:
        have = version(name)
    except PackageNotFoundError:  # a misspelt name: pip ignores a constraint on what it does not install
        wrong.append(f"{name}: pinned {spec}, not installed")
        continue
    if have not in SpecifierSet(spec):  # ==2.13.0 takes 2.13.0+cpu too
        wrong.append(f"{name}: pinned {spec}, installed {have}")
if wrong:
    sys.exit("oldest-versions install does not match the constraints: " + "; ".join(wrong))
print("oldest versions:", ", ".join(f"{name} {version(name)}" for name, _ in pins))
EOF
echo "oldest-versions install took $(( $(date +%s) - start )) s"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --disable-warnings "${TESTS[@]}"
echo "oldest-versions install and tests took $(( $(date +%s) - start )) s"
