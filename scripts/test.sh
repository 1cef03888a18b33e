#!/usr/bin/env bash
# The test suite on a fresh machine: set up .venv, prepare the real Fashion-MNIST (some tests
# train on it), run pytest. Extra arguments go to pytest, e.g. `bash scripts/test.sh -k launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python scripts/prepare_data.py --quiet
exec .venv/bin/python -m pytest "$@"
