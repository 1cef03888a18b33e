import sys

from esync.benchmark import main

sys.exit(main())
