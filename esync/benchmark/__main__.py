import sys

from esync.benchmark.driver import main

sys.exit(main())
