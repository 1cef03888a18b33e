#!/usr/bin/env bash
# The test suite on a fresh machine: set up .venv, prepare the real Fashion-MNIST (some tests
# train on it), run pytest. Extra arguments go to pytest, e.g. `bash scripts/test.sh -k launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The network-namespace tests need `ip` and `tc` (iproute2); as root we can install them.
if [ "$(id -u)" = 0 ] && ! { command -v ip && command -v tc; } >/dev/null; then
  echo "test.sh: installing iproute2 for the network-namespace tests"
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y iproute2; } >/dev/null
fi
.venv/bin/python scripts/prepare_data.py --quiet
exec .venv/bin/python -m pytest "$@"
