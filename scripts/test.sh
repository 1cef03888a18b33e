#!/usr/bin/env bash
# The test suite on a fresh machine: set up .venv, prepare the real Fashion-MNIST (some tests
# train on it), run pytest. Extra arguments go to pytest, e.g. `bash scripts/test.sh -k launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The dashboard test opens the page in Debian's headless chromium (it skips, saying why, without it).
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "test: installing Debian's chromium for the dashboard test"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
      >.venv/chromium-install.log 2>&1; then
    echo "test: installing chromium failed (see .venv/chromium-install.log); the dashboard" \
         "browser test will be skipped" >&2
  fi
fi
.venv/bin/python scripts/prepare_data.py --quiet
exec .venv/bin/python -m pytest "$@"
