"""Run every mode on the same emulated cluster, several times, and write one report folder.

    esync-benchmark                              # the default: ~90 min on 2 cores (see the plan)
    esync-benchmark --dry-run                    # the plan, its commands and time estimate only
    esync-benchmark --budget 8 --modes esync,sync,local --tune-lr none --net loopback \\
        --data iid --repeats 2                   # a smoke run of a few minutes

Rows: every mode of ``--modes``; ESync once per aggregation rule of ``--aggregations``
(default ``weighted+nesterov=0.9+gl=0.7,mean``); with ``--data both`` (the default) the cluster
modes again on by-class data, in the first network setting. Network settings (``--net both``,
the default): loopback, and every host in its own network namespace with links shaped to the
rate whose compute-to-communication ratio matches a real cluster (``shaping.py``). Scenarios
(``--scenarios``, default both): static (all of the above) and shifting (loopback, i.i.d.:
ESync under each policy, SSGD and ASGD while the second x1 device becomes 6x slower halfway).

Order: with ``--tune-lr`` (a learning-rate grid), first a short run of every row with each value
on loopback (once, not per repeat; a by-class row is tuned on by-class data); then
``--repeats`` rounds (default 3, seeds ``--seed``, ``--seed`` + 1, ...) of the full runs, each
row with its best value, one after the other, the same training-time budget each; SSGD's i.i.d.
runs go on until the target or ``--sync-cap-seconds`` (the paper's Table 1). Cluster modes run
through the launcher (``python -m esync.launch ... --max-seconds BUDGET --emulation E
--quiet``), standalone SGD as ``main.py -m local`` on one device, under the x1 device's CPU cap
when the cluster runs capped (``emulation.py``). The plan printed at the start estimates the
total time from the budgets and the per-run overhead measured in the last full report.

Afterwards every run is summarised and ``OUT/report.md`` gives, per row and setting, the median
and min–max over the repeats of the time to the target accuracy and of the final accuracy,
speedups (ratios of medians, saying where ranges overlap) over SSGD and over the best other
mode, Table 1, median throughput (also as a fraction of the physical limit), computing-time
ratio per device, traffic and state-server requests, the shifting scenario's table, which
emulation ran; figures draw the median accuracy with a min–max band. ``OUT/benchmark.json``
holds every repeat's numbers and the aggregates. A run that fails is reported (its name and the
tail of its output) and the others still run; the exit code is 1.

Package layout: ``options`` (command line), ``plan`` (rows, settings, runs, argv, estimate),
``shaping`` (the shaped link rate), ``emulation`` (CPU caps: which ran, the standalone's),
``runs`` (subprocesses, progress), ``metrics`` (numbers from the summaries), ``stats`` (median,
ranges, speedups, Table 1), ``report`` (report.md, benchmark.json, CSV, figures via
``esync.analysis.compare``).
"""
from esync.benchmark import report
from esync.benchmark.driver import main
from esync.benchmark.options import parse_args

__all__ = ["main", "parse_args", "report"]
