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
from __future__ import annotations

import shlex
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import esync.benchmark.metrics as metrics
import esync.benchmark.plan as plan
import esync.benchmark.report as report
import esync.benchmark.shaping as shaping
from esync.benchmark.options import PROG, UsageError, canonical_command, parse_args
from esync.benchmark.plan import child_env
from esync.benchmark.runs import Progress, run_job, tail

__all__ = ["main", "parse_args", "canonical_command", "child_env", "UsageError"]


def _run_all(jobs, progress: Progress, timeout: float | None) -> None:
    for job in jobs:
        progress.begin(job)
        run_job(job, progress, timeout)
        if job.error is None:
            metrics.summarise(job)
        progress.end(job)


def chosen_rates(args, rows, tuning: dict | None) -> dict[str, float]:
    """Each tuning group's learning rate: the tuning's best, else -l/-ll."""
    rates = {}
    for row in rows:
        best = (tuning or {}).get(row.group, {}).get("lr")
        rates.setdefault(row.group, best if best is not None else plan.default_lr(args, row))
    return rates


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    command = shlex.join([PROG, *argv])
    out = Path(args.out).resolve()
    args.out = str(out)
    out.mkdir(parents=True, exist_ok=True)
    started, t0 = datetime.now(), time.monotonic()
    rows = plan.rows(args)
    labels = {row.name: row.label for row in rows}
    problems: list[str] = []
    if args.net_notice:
        print(f"{PROG}: {args.net_notice}", file=sys.stderr)
    rates = None
    if "netns" in args.net_list:
        try:
            rates = shaping.derive(args)
        except (RuntimeError, OSError) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 1
    settings = plan.settings(args, rates)
    tune_jobs = plan.tuning_jobs(args, out, rows, settings[0])
    planned = plan.full_jobs(args, out, rows, settings, chosen_rates(args, rows, None))
    progress = Progress(len(tune_jobs) + len(planned))
    if rates is not None:
        measured = rates.get("measured")
        progress.note(f"shaped links: {','.join(rates['worker'])} per worker host, "
                      f"{rates['server']} at the server" + (
                          f" (derived: {measured['model_bytes'] / 1e6:.3g} MB model, "
                          f"{measured['compute_s'] * 1e3:.1f} ms per iteration here)"
                          if measured else ""))
    training = sum(j.budget for j in tune_jobs + planned)
    progress.note(f"{len(tune_jobs)} tuning run(s) and {len(planned)} full run(s), "
                  f"{training / 60:.0f} min of training in all; report in {out}")
    previous = signal.signal(signal.SIGTERM, _sigterm)
    jobs = []
    try:
        _run_all(tune_jobs, progress, args.job_timeout)
        tuning = metrics.best_learning_rates(tune_jobs) if tune_jobs else None
        if tuning:
            progress.note("learning rates: " + ", ".join(
                f"{g} {e['lr']:g}" if e["lr"] is not None else f"{g} default"
                for g, e in tuning.items()))
        jobs = plan.full_jobs(args, out, rows, settings, chosen_rates(args, rows, tuning))
        _run_all(jobs, progress, args.job_timeout)
    except KeyboardInterrupt:
        progress.close()
        print(f"{PROG}: interrupted; the run in progress was stopped; no report", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    progress.close()
    results = metrics.results(args, jobs, [s.name for s in settings])
    names = list(dict.fromkeys(row.name for row in rows))
    written = []
    for what, make in (("speedup tables", lambda: report.write_tables(args, results, out)),
                       ("figures", lambda: report.draw(args, results, settings, labels, out))):
        try:
            written += make()
        except Exception as exc:    # a bug in one figure must not cost the report
            problems.append(f"{what}: {type(exc).__name__}: {exc}")
    seconds = time.monotonic() - t0
    text = report.render(args, jobs=jobs, tune_jobs=tune_jobs, results=results,
                         settings=settings, names=names, labels=labels, tuning=tuning,
                         shaping=rates, written=written, problems=problems, command=command,
                         started=started, seconds=seconds)
    path = report.write_outputs(args, text, jobs=jobs, tune_jobs=tune_jobs, results=results,
                                tuning=tuning, shaping=rates, problems=problems,
                                command=command, started=started, seconds=seconds)
    print(f"{PROG}: report written to {path}")
    failed = [j for j in tune_jobs + jobs if not j.ok]
    for problem in problems:
        print(f"{PROG}: {problem}", file=sys.stderr)
    for job in failed:
        print(f"{PROG}: {job.tag} failed ({job.error}); last lines of {job.log}:\n"
              f"{tail(job.log, 10)}", file=sys.stderr)
    return 1 if failed or problems else 0


def _sigterm(*_):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
