"""Thin wrapper where the original's `drawer.py` was; the code is `esync/analysis/drawer.py`.

Run from the repository root: `python analysis/drawer.py -h`.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from esync.analysis.drawer import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
