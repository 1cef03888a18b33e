"""esync: one entry point for every role (scheduler, server, worker, evaluator, standalone).

    python main.py -m local -c 1 -n lenet -l 0.05        # one device, no cluster
    DMLC_ROLE=worker DMLC_PS_ROOT_URI=... python main.py -m esync -g 0 -n resnet18-v1

See README.md and ``python main.py --help``.
"""
import sys

from esync.entry import main

if __name__ == "__main__":
    sys.exit(main())
