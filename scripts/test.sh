#!/usr/bin/env bash
# The test suite on a fresh machine: set up .venv, prepare the real Fashion-MNIST (some tests
# train on it), run pytest. Extra arguments go to pytest, e.g. `bash scripts/test.sh -k launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Some tests run against real system programs: an sshd (ssh backend), a single-node Slurm with
# munge (Slurm backend), iproute2 (emulated hosts in network namespaces) and Debian's chromium
# (the dashboard in a headless browser), cmake and g++ (Horovod's build). As root, install what is missing; otherwise those tests
# skip and say why.
need=()
command -v /usr/sbin/sshd >/dev/null || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
{ command -v slurmctld && command -v slurmd; } >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
{ command -v ip && command -v tc; } >/dev/null || need+=(iproute2)
command -v chromium >/dev/null || need+=(chromium)
# cmake and g++ build Horovod (scripts/setup.sh) for the --collective allreduce tests.
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test: installing ${need[*]} (the backend, network-namespace and dashboard tests use them)"
    mkdir -p .venv
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq --no-install-recommends "${need[@]}"; } >.venv/apt.log 2>&1; then
      echo "test: installing ${need[*]} failed (see .venv/apt.log); the tests that need them" \
           "will skip and say why" >&2
    fi
  else
    echo "test: ${need[*]} missing and not root: the tests that need them will skip" >&2
  fi
fi
bash scripts/setup.sh
.venv/bin/python scripts/prepare_data.py --quiet
exec .venv/bin/python -m pytest "$@"
