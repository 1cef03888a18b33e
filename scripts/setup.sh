#!/usr/bin/env bash
# Create .venv with the pinned dependencies (idempotent: skipped when pyproject.toml is unchanged).
# Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      PY=$cand; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "setup: Python 3.11 is required (MXNet 1.9.1 does not run on 3.12+). Install it, or set PYTHON=/path/to/python3.11." >&2
  exit 1
fi
stamp=.venv/.esync-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: creating .venv with $("$PY" --version) and the pinned dependencies (first run takes a few minutes)"
# A set-up that was interrupted (Ctrl-C during pip) can leave a .venv without a working pip:
# start that one afresh instead of failing on it forever.
if [ -x .venv/bin/python ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  echo "setup: .venv is incomplete (an interrupted set-up?); creating it again"
  rm -rf .venv
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
log=.venv/setup.log
if ! { .venv/bin/python -m pip install --upgrade pip && .venv/bin/python -m pip install -e ".[test]"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "setup: installing the dependencies failed; the full log is $log" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "setup: done"
