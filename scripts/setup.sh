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

# Horovod (--collective allreduce) is built from source against the MXNet in .venv, with Gloo
# and without MPI, TensorFlow or PyTorch: about 2-3 minutes on 2 cores, once. Without cmake and
# a C++ compiler everything else still works; --collective allreduce then says what is missing.
HOROVOD=horovod==0.28.1
horovod_stamp=.venv/.esync-horovod
build_horovod() {
  if [ "$(cat "$horovod_stamp" 2>/dev/null)" = "$HOROVOD" ]; then
    return 0
  fi
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  { command -v g++ >/dev/null || command -v c++ >/dev/null; } || missing+=(g++)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: not building Horovod (needed only for --collective allreduce): ${missing[*]}" \
         "missing; install them (Debian: apt-get install ${missing[*]}) and run this again" >&2
    return 0
  fi
  echo "setup: building $HOROVOD with MXNet and Gloo for --collective allreduce (a few minutes)"
  local log=.venv/horovod.log
  if ! { .venv/bin/python -m pip install wheel "setuptools<70" \
         && HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
            HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
            .venv/bin/python -m pip install --no-build-isolation --no-cache-dir "$HOROVOD" \
         && .venv/bin/python -c "import horovod.mxnet as h; assert h.gloo_built()"; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "setup: building Horovod failed (full log: $log); everything but --collective" \
         "allreduce works" >&2
    return 0
  fi
  echo "$HOROVOD" > "$horovod_stamp"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  build_horovod
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
build_horovod
echo "setup: done"
