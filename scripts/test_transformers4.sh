#!/usr/bin/env bash
# The HF Trainer tests again, against the newest transformers 4.x (the package supports 4.40+ and 5.x).
# Uses .venv-tf4 (own torch pin, profcallbacks editable). An install failure (no registry) skips.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-tf4/bin/python ]; then
  "$PYTHON" -m venv .venv-tf4
fi
if ! .venv-tf4/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}" "transformers>=4.40,<5" \
      accelerate pytest pytest-timeout tensorboard -e . ; then
  echo "transformers 4.x tests skipped: could not install transformers 4.x"
  exit 0
fi
.venv-tf4/bin/python -c "import transformers; print('transformers', transformers.__version__)"
.venv-tf4/bin/python -m pytest -q -p no:cacheprovider tests/test_hf.py "tests/test_contract.py" -k "hf"
