#!/usr/bin/env bash
# The main job on a fresh machine: set up .venv, prepare Fashion-MNIST, run a local emulated
# heterogeneous cluster in ESync mode (4 CPU workers slowed 1x, 1x, 4x, 8x; lenet), then write
# the summary and figures. Extra arguments go to esync-cluster (see: .venv/bin/esync-cluster -h).
# Each run writes into a new folder logs/run-<time>/, so earlier runs are never overwritten.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python scripts/prepare_data.py
out=${ESYNC_RUN_DIR:-logs/run-$(date +%Y%m%d-%H%M%S)}
.venv/bin/esync-cluster -ld "$out" "$@"
network=$(.venv/bin/python -c 'import json,sys,glob; print(json.load(open(glob.glob(sys.argv[1]+"/*/*/cluster.json")[0]))["network"])' "$out")
.venv/bin/python analysis/drawer.py -b "$out" -n "$network"
echo "run.sh: logs, summary and figures in $out/$network/"
