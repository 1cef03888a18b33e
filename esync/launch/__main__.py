"""``python -m esync.launch`` is ``esync-cluster``."""
import sys

from esync.launch.program import main

sys.exit(main())
