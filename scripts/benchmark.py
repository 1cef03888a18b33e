"""Run every mode on one emulated cluster and write one report (see esync/benchmark/).

Usage, from the repository root: python scripts/benchmark.py [--budget 60] [--modes ...] [--net loopback] [--out D]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from esync.benchmark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
