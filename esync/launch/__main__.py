"""``python -m esync.launch`` is ``esync-cluster``."""
import sys

from esync.launch import main

sys.exit(main())
