"""Prepare Fashion-MNIST under <data_dir>/fashion-mnist/ (see esync/worker/prepare.py).

Usage, from the repository root: python scripts/prepare_data.py [--data-dir D] [--quiet]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from esync.worker.prepare import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
