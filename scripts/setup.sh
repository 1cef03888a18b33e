#!/usr/bin/env bash
# Create .venv with the pinned dependencies (idempotent: skipped when pyproject.toml and the MXNet
# wheel are unchanged).
# Usage: bash scripts/setup.sh [--gpu FLAVOUR | --cpu] [--check-only]
#   (none)        the MXNet wheel .venv has (the CPU one, mxnet, on a new .venv)
#   --gpu cu112   MXNet's CUDA 11.2 wheel instead of the CPU one (also cu110, cu102, cu101; see
#                 esync/launch/gpus.py for the GPUs each runs on), then checks this machine's GPUs
#   --cpu         back to the CPU wheel
#   --check-only  only check the GPUs against the wheel (ESYNC_GPU_CAPABILITIES=8.6,9.0 stands
#                 for two GPUs of those compute capabilities, without asking the driver or MXNet)
set -euo pipefail
cd "$(dirname "$0")/.."
flavour_stamp=.venv/.esync-mxnet
flavour=$(cat "$flavour_stamp" 2>/dev/null || echo cpu)
check_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) flavour=${2:-}; shift 2 || { echo "setup: --gpu needs a flavour, e.g. --gpu cu112" >&2; exit 2; } ;;
    --gpu=*) flavour=${1#--gpu=}; shift ;;
    --cpu) flavour=cpu; shift ;;
    --check-only) check_only=1; shift ;;
    *) echo "setup: unknown argument $1 (usage: bash scripts/setup.sh [--gpu FLAVOUR | --cpu] [--check-only])" >&2; exit 2 ;;
  esac
done
case "$flavour" in
  cpu|cu112|cu110|cu102|cu101) ;;
  *) echo "setup: no MXNet 1.9.1 wheel '$flavour': use --gpu cu112, cu110, cu102 or cu101, or --cpu" >&2; exit 2 ;;
esac
# The GPU checks (scripts/gpu_check.py): every GPU must be one the wheel has kernels for.
check_gpus() {
  [ "$flavour" = cpu ] && return 0
  "${1:-.venv/bin/python}" scripts/gpu_check.py --wheel "$flavour"
}
if [ "$check_only" = 1 ]; then
  PY_CHECK=.venv/bin/python
  [ -x "$PY_CHECK" ] || PY_CHECK=python3
  check_gpus "$PY_CHECK"
  exit $?
fi
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
[ "$flavour" = cpu ] || want="$want $flavour"

# Horovod (--collective allreduce) is built from source against the MXNet in .venv, with Gloo
# and without MPI, TensorFlow or PyTorch: about 2-3 minutes on 2 cores, once. Without cmake and
# a C++ compiler everything else still works; --collective allreduce then says what is missing.
# The stamp names the MXNet it was built against: another wheel (--gpu, --cpu) rebuilds it.
HOROVOD=horovod==0.28.1
horovod_stamp=.venv/.esync-horovod
build_horovod() {
  local mxnet
  mxnet=$(.venv/bin/python scripts/gpu_check.py --installed)
  if [ "$(cat "$horovod_stamp" 2>/dev/null)" = "$HOROVOD $mxnet" ]; then
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
  echo "setup: building $HOROVOD with $mxnet and Gloo for --collective allreduce (a few minutes)"
  local log=.venv/horovod.log
  if ! { .venv/bin/python -m pip install wheel "setuptools<70" \
         && HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
            HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
            .venv/bin/python -m pip install --no-build-isolation --no-cache-dir \
              --force-reinstall --no-deps "$HOROVOD" \
         && .venv/bin/python -m pip install psutil cloudpickle pyyaml packaging \
         && .venv/bin/python -c "import horovod.mxnet as h, horovod.runner.http.http_server; assert h.gloo_built()"; } >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "setup: building Horovod failed (full log: $log); everything but --collective" \
         "allreduce works" >&2
    return 0
  fi
  echo "$HOROVOD $mxnet" > "$horovod_stamp"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  build_horovod
  check_gpus
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
# Every MXNet wheel writes the same mxnet/ folder: the other ones go before this one comes.
others=()
for package in mxnet mxnet-cu112 mxnet-cu110 mxnet-cu102 mxnet-cu101; do
  [ "$package" = "$(if [ "$flavour" = cpu ]; then echo mxnet; else echo "mxnet-$flavour"; fi)" ] \
    || others+=("$package")
done
if ! { .venv/bin/python -m pip install --upgrade pip \
       && { .venv/bin/python -m pip uninstall -y "${others[@]}" || true; } \
       && .venv/bin/python -m pip install -e ".[$flavour,test]"; } >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "setup: installing the dependencies failed; the full log is $log" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "$flavour" > "$flavour_stamp"
build_horovod
check_gpus
echo "setup: done"
