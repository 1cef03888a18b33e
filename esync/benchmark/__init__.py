"""Run every mode on the same emulated cluster and write one report folder.

    esync-benchmark                              # the default: tuned rates, loopback + shaped links
    esync-benchmark --budget 20 --modes esync,sync,local --tune-lr none --net loopback
    esync-benchmark --net netns --bandwidth 200mbit --server-bandwidth 200mbit --repeats 3

Rows: every mode of ``--modes``; ESync once per aggregation rule of ``--aggregations``
(``ESync (fednova)``, ``ESync (weighted + Nesterov 0.9, gl 0.7)``, ...); with ``--data both``
(the default) the cluster modes again on by-class data. Network settings (``--net both``, the default): loopback,
and every host in its own network namespace with links shaped to the rate whose
compute-to-communication ratio matches a real cluster (``shaping.py`` says how it is derived).

Order: with ``--tune-lr`` (a learning-rate grid), first a short run of every row with each value
(first setting; a by-class row is tuned on by-class data, apart from its i.i.d. row); then the full runs, each row with its best value, one after the
other, the same training-time budget each. Cluster modes run through the launcher as a
subprocess (``python -m esync.launch ... --max-seconds BUDGET --quiet``), standalone SGD as
``main.py -m local`` on one device at full speed. Afterwards every run is summarised and
``OUT/report.md`` gives per row and setting: time to the target accuracy, speedup over SSGD and
over the best other mode, final accuracy next to standalone SGD's, throughput (also as a
fraction of the physical limit), computing-time ratio per device, traffic and state-server
requests; ``OUT/benchmark.json`` holds the same numbers for programs. A run that fails is
reported (its name and the tail of its output) and the others still run; the exit code is 1.

Package layout: ``options`` (command line), ``plan`` (rows, settings, runs and their argv),
``shaping`` (the shaped link rate), ``runs`` (subprocesses, progress), ``metrics`` (numbers from
the summaries), ``report`` (report.md, benchmark.json, figures via ``esync.analysis.compare``).
"""
from esync.benchmark import report
from esync.benchmark.driver import main
from esync.benchmark.options import parse_args
from esync.benchmark.report import _cell  # noqa: F401  (the report's cell format, for tests)

__all__ = ["main", "parse_args", "report"]
