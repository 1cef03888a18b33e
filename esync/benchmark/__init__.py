"""esync-benchmark: every mode on the same emulated cluster, one report folder.

    esync-benchmark                      # the default (see --help for what it runs and how long)
    esync-benchmark --dry-run            # the plan, its time estimate and every command

The program is ``driver.py`` (its docstring says what runs in which order); ``options`` (command
line), ``plan`` (rows, settings, runs), ``runs`` (subprocesses), ``metrics`` and ``stats``
(numbers), ``pace`` (the repeats' spread and the machine's speed in each run), ``report``
(report.md, benchmark.json, figures). The standalone run's CPU cap, what emulation ran and the
shaped link rate are the emulation world's (``esync.emulation.standalone_cap``, ``.shaping``).
"""
from esync.benchmark import report
from esync.benchmark.driver import main
from esync.benchmark.options import parse_args

__all__ = ["main", "parse_args", "report"]
