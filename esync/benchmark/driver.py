"""Run every mode on the same emulated cluster, several times, and write one report folder.

    esync-benchmark                              # the default: ~89 min on 2 cores (see the plan)
    esync-benchmark --dry-run                    # the plan, its commands and time estimate only
    esync-benchmark --budget 8 --modes esync,sync,local --tune-lr none --net loopback \\
        --data iid --repeats 2                   # a smoke run of a few minutes

Rows: every mode of ``--modes``; ESync once per aggregation rule of ``--aggregations``
(``options.DEFAULT_AGGREGATIONS``); the alternatives a user without ESync would pick (SSGD
and ASGD on the fast devices alone, ``--fast-devices``; Horovod's SSGD on the whole cluster and
on them, ``--horovod``); with ``--data both`` the cluster modes again on by-class data, in the
first network setting (the default is ``--data iid``). Network settings (``--net both``,
the default): loopback, and every host in its own network namespace with links shaped to the
rate whose compute-to-communication ratio matches a real cluster (``shaping.py``). Scenarios
(``--scenarios``, default both): static (all of the above) and shifting (loopback, i.i.d.:
ESync under each policy, SSGD and ASGD while the second x1 device becomes 6x slower after
``--shift-at``, a quarter of the budget by default).

Order: with ``--tune-lr`` (a learning-rate grid, widened while a row's best value sits at its
edge: ``plan.widening_jobs``; every row but ESync's once per momentum of ``--tune-momentum``,
its rates times (1 - momentum), and it runs with its best pair), first a short run of every
row with each value
on loopback (once, not per repeat; a by-class row is tuned on by-class data); then
``--repeats`` rounds (default 3, seeds ``--seed``, ``--seed`` + 1, ...) of the full runs, each
row with its best value, one after the other, the same training-time budget each; SSGD's i.i.d.
runs go on until the target or ``--sync-cap-seconds`` (the paper's Table 1). Cluster modes run
through the launcher (``python -m esync.launch ... --max-seconds BUDGET --emulation E
--quiet``), standalone SGD as ``main.py -m local`` on one device, under the x1 device's CPU cap
when the cluster runs capped (``emulation.py``). The plan printed at the start estimates the
total time from the budgets and the per-run overhead measured in a full benchmark.

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
from __future__ import annotations

import shlex
import signal
import sys
import time
from datetime import datetime
from pathlib import Path

import esync.benchmark.own_machines as own_machines
import esync.benchmark.metrics as metrics
import esync.benchmark.probes as probes
import esync.benchmark.plan as plan
import esync.benchmark.report as report
import esync.emulation.shaping as shaping
import esync.emulation.standalone_cap as emulation
from esync.benchmark.options import (PROG, UsageError, canonical_command,
                                     describe_byclass_grid, parse_args, repeat_seeds, started_at,
                                     sync_cap, write_invocation)
from esync.benchmark.plan import child_env
from esync.benchmark.runs import Progress, keep_if_finished, run_job, tail, why_not_kept

__all__ = ["main", "parse_args", "canonical_command", "child_env", "UsageError"]


class Eta:
    """Minutes left: the remaining runs' estimates, scaled by how the finished runs compared
    with theirs (this machine today, whatever else runs on it)."""

    def __init__(self, jobs):
        self.left = sum(self.of(j) for j in jobs)
        self.estimated = self.spent = 0.0

    @staticmethod
    def of(job) -> float:
        return job.budget + plan.run_overhead(job)

    def done(self, job) -> float:
        self.left -= self.of(job)
        self.estimated += self.of(job)
        self.spent += job.seconds
        return max(0.0, self.left) * (self.spent / self.estimated if self.estimated else 1.0)


def _run_all(jobs, progress: Progress, timeout: float | None, eta: Eta) -> None:
    for job in jobs:
        # --resume: a run an earlier invocation finished is kept; say why one is not
        if not keep_if_finished(job) and job.resume and (why := why_not_kept(job)):
            progress.note(f"{job.tag}: runs again under --resume: {why}")
        progress.begin(job)
        run_job(job, progress, timeout)
        if job.error is None:
            metrics.summarise(job)
        progress.end(job, eta.done(job))


def tune(args, out: Path, rows, tune_jobs, progress: Progress, eta: Eta, cap):
    """Run the tuning grid ``tune_jobs`` of ``rows``, then the runs its results call for
    (widening, lengthening, confirming: ``plan``); -> (every tuning run, the choice per group).
    The sweep tunes each gap's rows with it, as the benchmark tunes its own."""
    cap.apply(tune_jobs)
    _run_all(tune_jobs, progress, args.job_timeout, eta)
    tuning = metrics.best_learning_rates(tune_jobs) if tune_jobs else None

    def run_more(more, why, planned=False):
        """More tuning runs once the grid has run; the choice is made again with them."""
        nonlocal tune_jobs, tuning
        progress.note(why + ", ".join(f"{j.row.group} {j.lr:g}" for j in more))
        if not planned:                  # not in the plan's count and estimate yet
            progress.extend(len(more))
            eta.left += sum(eta.of(j) for j in more)
        cap.apply(more)
        _run_all(more, progress, args.job_timeout, eta)
        tune_jobs += more
        tuning = metrics.best_learning_rates(tune_jobs)

    def widen():
        """A best rate at an edge of the grid may not be the best: try beyond it."""
        while tuning and (wider := plan.widening_jobs(args, out, rows, tuning)):
            run_more(wider, "learning-rate grid widened: ")

    widen()
    longer = plan.lengthening_jobs(args, out, rows, tuning)
    if longer:
        # a by-class row whose short runs have not left chance cannot rank its rates
        run_more(longer, f"tuning runs lengthened to {longer[0].budget:g} s (no rate "
                         f"left chance in {longer[0].budget / plan.LENGTHENING:g} s): ")
        widen()                  # the longer runs' best may sit at an edge
    confirming = plan.confirming_jobs(args, out, rows, tuning)
    if confirming:
        # the best rates again with the next seed: one seed cannot tell a good rate
        # from one that diverges in another
        run_more(confirming, f"confirming with {plan.describe_seeds(confirming)}: ",
                 planned=True)
        widen()      # the mean over the seeds may move the best to an edge
    if tuning:
        progress.note("learning rates: " + ", ".join(
            f"{g} {e['lr']:g}" if e["lr"] is not None else f"{g} default"
            for g, e in tuning.items()))
        progress.note("chosen (rate, momentum): " + ", ".join(
            f"{g} ({lr:g}, {m:g})" for g, (lr, m) in plan.chosen_pairs(args, rows, tuning).items()))
    return tune_jobs, tuning


def chosen_rates(args, rows, tuning: dict | None) -> dict[str, float]:
    """Each row group's learning rate (``plan.chosen_pairs``): the tuning's best pair's, else
    -l/-ll."""
    return {g: lr for g, (lr, _) in plan.chosen_pairs(args, rows, tuning).items()}


def chosen_momenta(args, rows, tuning: dict | None) -> dict[str, float]:
    """Each row group's momentum: the tuning's best pair's, else none."""
    return {g: m for g, (_, m) in plan.chosen_pairs(args, rows, tuning).items()}


def describe_plan(args, tune_jobs, jobs, settings, confirming=()) -> list[str]:
    """What will run and how long it should take (printed at the start). ``confirming``: the
    runs that will confirm the best rates (their rates known only then)."""
    L = []
    if tune_jobs:
        groups = len({j.row.group for j in tune_jobs})
        byclass = any(args.splits) and args.byclass_lr_grid != args.lr_grid
        momenta = ", ".join(f"{m:g}" for m in args.momentum_grid)
        L.append(f"plan: {len(tune_jobs)} tuning run(s) ({groups} group(s) × "
                 f"{len(args.lr_grid)} rates, {args.tune_budget:g} s each; every row but "
                 f"ESync's once per momentum {momenta}, the rates × (1 - momentum)"
                 + (f"; by class {describe_byclass_grid(args)}" if byclass else "")
                 + (f", {args.byclass_tune_budget:g} s each" if byclass
                    else f" ({args.byclass_tune_budget:g} s by class)" if any(args.splits)
                    else "")
                 + f"; on {'the machines' if getattr(args, 'machines', None) else 'loopback'}, "
                   f"seed {args.seed})"
                 + (f", then {len(confirming)} with {plan.describe_seeds(confirming)} (each "
                    f"i.i.d. row's {plan.CONFIRMED_RATES} best pairs again)" if confirming
                    else ""))
    first = [j for j in jobs if j.rep == 1]
    per = ", ".join(f"{s.name} {sum(1 for j in first if j.setting.name == s.name)}"
                    for s in settings)
    seeds = ", ".join(map(str, repeat_seeds(args)))
    extended = sum(1 for j in first if j.extended)
    L.append(f"plan: {len(jobs)} full run(s): {args.repeats} repeat(s) (seeds {seeds}) × "
             f"{len(first)} ({per}) of {args.budget:g} s"
             + (f" ({args.byclass_budget:g} s by class)" if any(args.splits) else "")
             + (f"; SSGD's {extended} i.i.d. run(s) per repeat until "
                f"{plan.sync_target(args):.2f} or {sync_cap(args):g} s"
                if extended else ""))
    est = plan.estimate([*tune_jobs, *confirming, *jobs])
    o = plan.OVERHEAD_S
    fixed, share = plan.STANDALONE_OVERHEAD_S
    L.append(f"estimated time: {est['total_s'] / 60:.0f} min = {est['training_s'] / 60:.0f} min "
             f"of training (SSGD's cap counted in full) + {est['overhead_s'] / 60:.0f} min of "
             f"start-up, scoring and summaries (per run: {o['loopback']:g} s on loopback, "
             f"{o['netns']:g} s with shaped links, {o['tune']:g} s per tuning run, standalone "
             f"{fixed:g} s + {share:g} × its budget; measured in a full benchmark on a slow "
             f"machine) + {plan.FIXED_OVERHEAD_S / 60:.1f} min")
    return L


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    command = shlex.join([PROG, *argv])
    if args.gap_sweep:
        from esync.benchmark import sweep
        return sweep.run(args, command, sweep.DriverSteps(
            tune=tune, run_all=_run_all, eta=Eta, chosen_rates=chosen_rates,
            chosen_momenta=chosen_momenta))
    out = Path(args.out).resolve()
    args.out = str(out)
    started, t0 = (args.resume and started_at(args)) or datetime.now(), time.monotonic()
    rows = plan.rows(args)
    labels = {row.name: row.label for row in rows}
    problems: list[str] = []
    for notice in (args.net_notice, args.scenario_notice, args.horovod_notice):
        if notice:
            print(f"{PROG}: {notice}", file=sys.stderr)
    rates = None
    if "netns" in args.net_list and "static" in args.scenario_list:
        if args.dry_run:
            rates = {"worker": args.bandwidths or ["auto"], "server": args.server_rate or "auto"}
        else:
            try:
                rates = shaping.derive(args)
            except (RuntimeError, OSError) as exc:
                print(f"{PROG}: error: {exc}", file=sys.stderr)
                return 1
    settings = plan.settings(args, rates)
    tune_jobs = plan.tuning_jobs(args, out, rows)
    planned = plan.full_jobs(args, out, rows, settings, chosen_rates(args, rows, None),
                             chosen_momenta(args, rows, None))
    confirmations = plan.planned_confirmations(args, out, rows)
    lines = describe_plan(args, tune_jobs, planned, settings, confirmations)
    if args.machines:
        lines += own_machines.plan_lines(args.machines)
    if args.dry_run:
        print("\n".join(f"{PROG}: {line}" for line in lines))
        for job in tune_jobs + planned:
            print(f"[{job.tag}] {shlex.join(plan.display_argv(job.argv))}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    write_invocation(args)
    progress = Progress(len(tune_jobs) + len(confirmations) + len(planned))
    if rates is not None:
        measured = rates.get("measured")
        progress.note(f"shaped links: {','.join(rates['worker'])} per worker host, "
                      f"{rates['server']} at the server" + (
                          f" (derived: {measured['model_bytes'] / 1e6:.3g} MB model, "
                          f"{measured['compute_s'] * 1e3:.1f} ms per iteration here)"
                          if measured else ""))
    for line in lines:
        progress.note(line)
    progress.note(f"report in {out}")
    previous = signal.signal(signal.SIGTERM, _sigterm)
    jobs, tuning = [], None
    eta = Eta(tune_jobs + confirmations + planned)
    cap = (probes.RealDevices(args, out, progress) if args.machines
           else emulation.StandaloneCap(args))
    try:
        with cap:
            progress.note("standalone SGD: " + (
                f"capped at {cap.share:g} core, like a ×1 device of the cluster"
                if cap.share is not None else f"uncapped ({cap.reason})"))
            tune_jobs, tuning = tune(args, out, rows, tune_jobs, progress, eta, cap)
            jobs = plan.full_jobs(args, out, rows, settings, chosen_rates(args, rows, tuning),
                                  chosen_momenta(args, rows, tuning))
            cap.apply(jobs)
            _run_all(jobs, progress, args.job_timeout, eta)
    except KeyboardInterrupt:
        progress.close()
        print(f"{PROG}: interrupted; the run in progress was stopped; no report", file=sys.stderr)
        return 130
    except probes.ProbeFailed as exc:
        progress.close()
        print(f"{PROG}: error: {exc}; no report", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    progress.close()
    if cap.problem:
        problems.append(cap.problem)
    standalone = cap.info
    results = metrics.results(args, jobs, [s.name for s in settings],
                              standalone_share=cap.share)
    seen = emulation.survey(tune_jobs + jobs)
    names = list(dict.fromkeys(row.name for row in rows if row.scenario == "static"))
    written = []
    for what, make in (("tables", lambda: report.write_tables(args, results, out, labels)),
                       ("figures", lambda: report.draw(args, results, settings, labels, out))):
        try:
            written += make()
        except Exception as exc:    # a bug in one figure must not cost the report
            problems.append(f"{what}: {type(exc).__name__}: {exc}")
    seconds = time.monotonic() - t0
    text = report.render(args, jobs=jobs, tune_jobs=tune_jobs, results=results,
                         settings=settings, names=names, labels=labels, tuning=tuning,
                         shaping=rates, written=written, problems=problems, command=command,
                         started=started, seconds=seconds, emulation=seen,
                         standalone=standalone)
    path = report.write_outputs(args, text, jobs=jobs, tune_jobs=tune_jobs, results=results,
                                tuning=tuning, shaping=rates, problems=problems,
                                command=command, started=started, seconds=seconds,
                                emulation=seen, standalone=standalone,
                                estimate=plan.estimate(tune_jobs + confirmations + planned))
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
