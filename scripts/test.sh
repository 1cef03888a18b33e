#!/usr/bin/env bash
# The test suite on a fresh machine: set up .venv, prepare the real Fashion-MNIST (some tests
# train on it), run pytest. Extra arguments go to pytest, e.g. `bash scripts/test.sh -k launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The cluster backends are tested against real daemons: an sshd (ssh backend) and a single-node
# Slurm with munge (Slurm backend). As root, install what is missing; otherwise those tests skip
# and say why.
need=()
command -v /usr/sbin/sshd >/dev/null || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v slurmctld >/dev/null && command -v slurmd >/dev/null || need+=(slurm-wlm)
command -v munged >/dev/null || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test: installing ${need[*]} (the ssh and Slurm backend tests use them)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "test: ${need[*]} missing and not root: the ssh/Slurm backend tests will skip" >&2
  fi
fi
bash scripts/setup.sh
# The network-namespace tests need `ip` and `tc` (iproute2); as root we can install them.
if [ "$(id -u)" = 0 ] && ! { command -v ip && command -v tc; } >/dev/null; then
  echo "test.sh: installing iproute2 for the network-namespace tests"
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y iproute2; } >/dev/null
fi
.venv/bin/python scripts/prepare_data.py --quiet
exec .venv/bin/python -m pytest "$@"
