"""The heterogeneity sweep: the same fast devices beside slow devices at a widening gap.

    esync-benchmark --gap-sweep 1,4,16,64,150,300             # the sweep (see the plan it prints)
    esync-benchmark --gap-sweep 1,16,150 --dry-run            # its plan, caps and commands only
    esync-benchmark --gap-sweep 1,150 --budget 20 --tune-lr none --repeats 1   # a smoke run

Per gap G the cluster is two x1 devices and two devices at G:1 (``gap_factors``). Rows on the
whole cluster: ESync under the launcher's defaults (no aggregation flags: what a user gets),
SSGD, ASGD and DC-ASGD; rows without the slow devices: the fast devices alone (ESync under
its defaults, which the advisor's prediction "the fast devices alone" is checked against, and
SSGD with momentum 0.9 on the two x1 devices: the strongest "leave them out" row of issue 58)
and one device alone. ``--modes`` keeps the rows of its modes (``--modes esync``: ESync's two
rows, the advisor's check). Every row is tuned as the benchmark tunes (``driver.tune``: the
grid, widened, confirmed; SSGD, ASGD and DC-ASGD on the whole cluster over ``--tune-momentum``
too, since ESync's outer step has momentum), the whole-cluster rows at every gap, the rows
without slow devices once (they do not change with the gap). The full runs are interleaved:
repeat 1 of every row at every gap, then repeat 2, ...

Every x1 device has the same CPU cap at every gap (``sweep_share``: the largest that fits the
tightest gap, 1:1), so that "the same fast devices" holds; a slow device gets share / G. Such
small caps need long CFS periods (``esync.emulation.cgroups.quota_for`` grows them up to 1 s);
``cap_table`` says where a device's cap becomes coarse against its iteration.

The report, ``OUT/report.md`` (named as the benchmark's): one table (time to --target per row
and gap, median and range over the repeats, and ESync's lead over the next row: ``lead_cell``),
one figure (the same against the gap, log x),
``esync-advise``'s predictions from each gap's ESync runs beside the measured times, each row's
rate and momentum, the caps; ``OUT/benchmark.json`` holds every gap's numbers.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

import esync.benchmark.metrics as metrics
import esync.benchmark.plan as plan
from esync.benchmark import options, stats
from esync.benchmark.options import PROG
from esync.benchmark.plan import LOOPBACK, Job, Row
from esync.benchmark.runs import resume_note
from esync.common import modes
from esync.common.errors import UsageError
from esync.emulation import cgroups

FAST_FACTORS = (1.0, 1.0)       # the fast devices, the same at every gap
SLOW_DEVICES = 2                # devices at the gap
CLUSTER_MODES = ("esync", "sync", "async", "dcasgd")
FAST_ALONE = "sync-fast"        # SSGD on the fast devices alone
ESYNC_ROW = "esync"               # ESync under the launcher's defaults on the whole cluster
ESYNC_FAST_ALONE = "esync-fast" # ESync on them: the advisor's prediction without the slow ones
FAST_ALONE_MOMENTUM = 0.9       # the strongest row without the slow devices
ALONE_DIR = "alone"             # the rows without slow devices: run once, shown at every gap
COARSE_SHARE = 0.1              # a cap is coarse when its granularity exceeds this share
# CPU seconds of one lenet iteration (batch 64) on one free core, for the plan's cap table
# before anything has run: the slow machine of docs/BENCHMARK.md ("Budget"). The report uses
# the runs' own x1 pace instead.
REFERENCE_ITERATION_S = 0.0298


def parse_gaps(text: str) -> list[float]:
    """``"1,4,16"`` -> [1.0, 4.0, 16.0] (sorted, distinct); a gap is a number >= 1."""
    try:
        gaps = sorted({float(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise UsageError(f"argument --gap-sweep: {text!r} is not a comma-separated list of "
                         "gaps, e.g. 1,4,16,64,150,300") from None
    if not gaps or any(not (math.isfinite(g) and g >= 1) for g in gaps):
        raise UsageError(f"argument --gap-sweep: every gap is a number >= 1 (a slow device's "
                         f"slow-down against the x1 devices), got {text!r}")
    return gaps


def gap_factors(gap: float) -> list[float]:
    """The cluster at one gap: the fast devices, then ``SLOW_DEVICES`` devices at ``gap``."""
    return [*FAST_FACTORS, *([gap] * SLOW_DEVICES)]


def factors_text(factors) -> str:
    return ",".join(f"{f:g}" for f in factors)


def sweep_share(gaps: list[float], cores: float,
                reserve: float = cgroups.DEFAULT_RESERVE) -> float:
    """A x1 device's cap at every gap: the largest that fits the cluster of every gap (the
    smallest gap's, which has the most compute) beside ``reserve`` cores."""
    return min(cgroups.default_share(gap_factors(g), cores, reserve) for g in gaps)


def cluster_rows(mode_list=CLUSTER_MODES) -> list[Row]:
    """The rows on the whole cluster of ``mode_list``'s modes, each its own tuning group."""
    found = []
    for name in CLUSTER_MODES:
        if name not in mode_list:
            continue
        label = "ESync (the launcher's defaults)" if name == "esync" else modes.get(name).label
        found.append(Row(name=name, label=label, mode=name, split=0, group=name))
    return found


def alone_rows(mode_list=(*CLUSTER_MODES, modes.STANDALONE)) -> list[Row]:
    """The rows without the slow devices (they are the same at every gap): ESync under its
    defaults on the fast devices (what the advisor's "the fast devices alone" predicts), SSGD
    with momentum on them, one device alone; those of ``mode_list``'s modes."""
    fast = ("--momentum", f"{FAST_ALONE_MOMENTUM:g}")
    found = []
    if "esync" in mode_list:
        found.append(Row(name=ESYNC_FAST_ALONE, label="ESync, the fast devices alone",
                         mode="esync", split=0, group=ESYNC_FAST_ALONE))
    if "sync" in mode_list:
        found.append(Row(name=FAST_ALONE, label=f"SSGD, momentum {FAST_ALONE_MOMENTUM:g}, the "
                                                "fast devices alone", mode="sync", split=0,
                         extra=fast, group=FAST_ALONE))
    if modes.STANDALONE in mode_list:
        found.append(Row(name=modes.STANDALONE, label=modes.get(modes.STANDALONE).label,
                         mode=modes.STANDALONE, split=0, group=modes.STANDALONE))
    return found


def gap_args(args, gap: float | None) -> argparse.Namespace:
    """The benchmark's options for one gap (None: the rows without slow devices, on the fast
    devices alone)."""
    copy = argparse.Namespace(**vars(args))
    factors = list(FAST_FACTORS) if gap is None else gap_factors(gap)
    copy.workers, copy.slowdowns = len(factors), factors
    copy.slowdown = factors_text(factors)
    copy.splits, copy.scenario_list, copy.net_list = [0], ["static"], ["loopback"]
    copy.sync_cap_seconds = args.budget       # every row within the budget: no Table 1 runs
    # the sweep's own rows without the slow devices (SSGD's with its fixed momentum), no
    # Horovod rows; on the whole cluster SSGD, ASGD and DC-ASGD are tuned over --tune-momentum
    # as in the benchmark, since ESync's outer step has momentum
    copy.fast_list, copy.horovod_rows = [], False
    if gap is None:
        copy.momentum_grid = [0.0]
    return copy


@dataclass
class GapPlan:
    """One gap (None: the rows without slow devices) with its options, rows and runs."""
    gap: float | None
    args: argparse.Namespace
    out: Path
    rows: list[Row]
    tune_jobs: list[Job]
    confirmations: list[Job]      # the confirming runs tuning will add (their count, budgets)
    tuning: dict | None = None
    jobs: list[Job] | None = None

    @property
    def name(self) -> str:
        return ALONE_DIR if self.gap is None else f"gap{self.gap:g}"


def build(args, out: Path) -> list[GapPlan]:
    """The rows without slow devices first, then one ``GapPlan`` per gap."""
    found = []
    for gap in [None, *args.gaps]:
        g_args = gap_args(args, gap)
        name = ALONE_DIR if gap is None else f"gap{gap:g}"
        rows = alone_rows(args.mode_list) if gap is None else cluster_rows(args.mode_list)
        found.append(GapPlan(gap=gap, args=g_args, out=out / name, rows=rows,
                             tune_jobs=plan.tuning_jobs(g_args, out / name, rows),
                             confirmations=plan.planned_confirmations(g_args, out / name,
                                                                      rows)))
    return found


def full_jobs(plans: list[GapPlan], rates: dict[str, dict[str, float]],
              momenta: dict[str, dict[str, float]] | None = None) -> list[Job]:
    """Every full run at its row's tuned rate and momentum (``momenta``: per gap, per row
    group; none: 0), interleaved: repeat 1 of every row at every gap, then repeat 2, ..."""
    per_plan = []
    for p in plans:
        p.jobs = plan.full_jobs(p.args, p.out, p.rows, [LOOPBACK], rates[p.name],
                                (momenta or {}).get(p.name))
        per_plan.append(p.jobs)
    repeats = plans[0].args.repeats
    return [j for rep in range(1, repeats + 1) for jobs in per_plan for j in jobs if j.rep == rep]


# ----------------------------------------------------------------------------- CPU caps

@dataclass(frozen=True)
class DeviceCap:
    """One device's CPU cap: ``cores`` as ``quota_us`` per ``period_us``."""
    factor: float
    cores: float
    quota_us: int
    period_us: int

    def granularity(self, iteration_cpu_s: float) -> float:
        """How coarsely the cap times one iteration, as a share of its wall time.

        The device runs ``quota`` per period, then is throttled for ``period - quota``; an
        iteration of ``iteration_cpu_s`` CPU seconds lasts ``iteration_cpu_s * period / quota``
        and ends anywhere within a throttled stretch, so it is known only to within
        ``period - quota``: that over the iteration's wall time."""
        quota, period = self.quota_us / 1e6, self.period_us / 1e6
        return quota * (period - quota) / (iteration_cpu_s * period)

    def coarse(self, iteration_cpu_s: float) -> bool:
        return self.granularity(iteration_cpu_s) > COARSE_SHARE


def device_cap(share: float, factor: float, min_run_us: int) -> DeviceCap:
    cores = share / factor
    quota, period = cgroups.quota_for(cores, min_run_us)
    return DeviceCap(factor=factor, cores=cores, quota_us=quota, period_us=period)


def slice_in_force() -> int:
    """The CFS bandwidth slice the launcher's caps will meet: its fine slice where it may write
    the kernel's (root), else the kernel's default."""
    writable = cgroups.SLICE_FILE.exists() and os.access(cgroups.SLICE_FILE, os.W_OK)
    return cgroups.FINE_SLICE_US if writable else cgroups.MIN_RUN_US


def cap_table(gaps: list[float], share: float, iteration_cpu_s: float,
              min_run_us: int) -> list[str]:
    """A Markdown table: per gap, the slow devices' cap, its quota and period, its longest
    stall and its granularity against one iteration; then the x1 devices'."""
    lines = ["| device | cap (cores) | quota / period | longest stall | one iteration | "
             "granularity |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for factor in [1.0, *[g for g in gaps if g != 1.0]]:
        cap = device_cap(share, factor, min_run_us)
        stall = (cap.period_us - cap.quota_us) / 1e3
        wall = iteration_cpu_s * cap.period_us / cap.quota_us
        share_text = f"{cap.granularity(iteration_cpu_s):.1%}"
        lines.append(f"| x{factor:g} | {cap.cores:.4g} | {cap.quota_us / 1e3:g} ms / "
                     f"{cap.period_us / 1e3:g} ms | {stall:g} ms | {wall:.3g} s | "
                     + (f"**{share_text} (coarse)**" if cap.coarse(iteration_cpu_s)
                        else share_text) + " |")
    return lines


def coarse_gaps(gaps: list[float], share: float, iteration_cpu_s: float,
                min_run_us: int) -> list[float]:
    """The gaps whose slow devices' caps are coarse (``DeviceCap.coarse``)."""
    return [g for g in gaps if device_cap(share, g, min_run_us).coarse(iteration_cpu_s)]


def measured_iteration_cpu_s(results: dict, batch: int, share: float | None) -> float | None:
    """CPU seconds per iteration of a x1 device, from the runs' x1 pace (seconds per sample
    under the cap) times the batch and the cap: the median over every run."""
    paces = [m.get("x1_seconds_per_sample") for r in results.values()
             for reps in r["per_rep"].values() for m in reps if m is not None]
    pace = stats.median([p for p in paces if p])
    return None if pace is None or share is None else pace * batch * share


# ----------------------------------------------------------------------------- the report

def gap_results(plans: list[GapPlan], share: float | None) -> dict[str, dict]:
    """Per gap: ``metrics.results`` over its own runs and the rows without slow devices."""
    alone = plans[0]
    found = {}
    for p in plans[1:]:
        jobs = [*p.jobs, *alone.jobs]
        found[p.name] = metrics.results(p.args, jobs, [LOOPBACK.name],
                                        standalone_share=share)[LOOPBACK.name]
    return found


def table(plans: list[GapPlan], results: dict[str, dict], target: float) -> list[str]:
    """Rows by gaps: the time to ``target`` (median, min-max); the best per gap in bold."""
    gaps = plans[1:]
    rows = [*gaps[0].rows, *plans[0].rows]
    lines = [f"| row (time to {target:g}, s) | " + " | ".join(f"{p.gap:g}:1" for p in gaps)
             + " |", "| --- |" + " ---: |" * len(gaps)]
    best = {}
    for p in gaps:
        times = {n: e["time"].median for n, e in results[p.name]["rows"].items() if "time" in e}
        best[p.name] = min(times, key=times.get) if times else None
    for row in rows:
        cells = []
        for p in gaps:
            entry = results[p.name]["rows"].get(row.name, {})
            cell = stats.time_cell(entry.get("time"), p.args.budget)
            cells.append(f"**{cell}**" if best[p.name] == row.name
                         and entry["time"].median != stats.INF else cell)
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    labels = {row.name: row.label for row in rows}
    lines.append("| *ESync's lead: the next row's median over its own* | "
                 + " | ".join(lead_cell(results[p.name]["rows"], labels, p.args.budget)
                              for p in gaps) + " |")
    return lines


def lead_cell(rows: dict[str, dict], labels: dict[str, str], budget: float) -> str:
    """How many times sooner ESync on the whole cluster reached the target than the fastest
    other row of its gap (every row, the fast devices alone and ESync on them included),
    from medians; below 1 where another row was sooner."""
    times = {n: e["time"] for n, e in rows.items() if e.get("time") is not None}
    esync = times.pop(ESYNC_ROW, None)
    if esync is None or not times:
        return "-"
    reached = {n: t for n, t in times.items() if t.finite_median is not None}
    if not reached and esync.finite_median is not None:
        return f"> {budget / esync.finite_median:.2f}× (no other row reached it)"
    if not reached:
        return "-"
    other = min(reached, key=lambda n: reached[n].finite_median)
    lead = stats.speedup(esync, reached[other], row_horizon=budget, reference_horizon=budget)
    if lead is None:
        return "-"
    return (f"{lead.text()} over {labels.get(other, other)}"
            + ("; ranges overlap" if lead.overlap else ""))


def draw(plans: list[GapPlan], results: dict[str, dict], target: float, out: Path) -> Path:
    """Time to the target against the gap (log x), one line per row, min-max as error bars;
    a row that missed the target at a gap has no point there."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    gaps = plans[1:]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in [*gaps[0].rows, *plans[0].rows]:
        xs, ys, lows, highs = [], [], [], []
        for p in gaps:
            t = results[p.name]["rows"].get(row.name, {}).get("time")
            if t is None or not t.values or t.median == stats.INF:
                continue
            xs.append(p.gap)
            ys.append(t.median)
            lows.append(t.median - t.low)
            highs.append((t.high if t.high != stats.INF else t.median) - t.median)
        if xs:
            ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, label=row.label,
                        color=modes.colour(row.name), linestyle="--" if row in plans[0].rows
                        else "-")
    if not ax.lines:
        ax.text(0.5, 0.5, f"no row reached {target:g} at any gap", ha="center",
                transform=ax.transAxes)
    ax.set_xscale("log")
    ax.set_xticks([p.gap for p in gaps], [f"{p.gap:g}:1" for p in gaps])
    ax.minorticks_off()
    ax.set_xlabel("gap (slow-down of the two slow devices against the two x1 devices)")
    ax.set_ylabel(f"time to {target:g} test accuracy (s)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "figures" / "sweep-time-to-target.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def advisor_rows(plans: list[GapPlan], results: dict[str, dict], target: float) -> list[str]:
    """Per gap, ``esync-advise`` on each of its ESync runs (the median of their predictions)
    against what the sweep measured: the whole cluster against ESync's median, the fast devices
    alone against ESync's row on them (when it ran), each with its error; and its advice."""
    from esync.analysis import advise
    lines = ["| gap | predicted, every device | measured, ESync | error | predicted, fast "
             "devices alone | measured, ESync on them | error | advice |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    alone = results_alone(plans, results)
    caveated = False
    for p in plans[1:]:
        rows = results[p.name]["rows"]
        whole_measured = rows.get("esync", {}).get("time")
        predictions, failures = [], []
        for job in [j for j in p.jobs or [] if j.row.name == "esync" and j.ok]:
            try:
                predictions.append(advise.advise(advise.read(job.folder, target)))
            except advise.AdviceError as exc:
                failures.append(str(exc))
        if not predictions:
            reason = failures[0] if failures else "no ESync run finished"
            lines.append(f"| {p.gap:g}:1 | {reason} | "
                         f"{stats.time_cell(whole_measured, p.args.budget)} | | | | | |")
            continue
        whole = stats.median([by_label(a, "every device") for a in predictions])
        fast = stats.median([t for t in (by_label(a, advise.FAST_ALONE)
                                         for a in predictions) if t is not None])
        verdicts = sorted({("include" if v["include"] else "leave out") + " " + v["device"]
                           for a in predictions for v in a["verdicts"]})
        mark = CAVEAT_MARK if any(c.startswith(f"{advise.FAST_ALONE}:") for a in predictions
                                  for c in a["caveats"]) else ""
        caveated = caveated or bool(mark)
        lines.append(f"| {p.gap:g}:1 | {whole:.1f} | "
                     f"{stats.time_cell(whole_measured, p.args.budget)} | "
                     f"{error_cell(whole, whole_measured)} | "
                     f"{'-' if fast is None else f'{fast:.1f}{mark}'} | "
                     f"{stats.time_cell(alone, p.args.budget) if alone else '-'} | "
                     f"{error_cell(fast, alone)} | {'; '.join(verdicts) or '-'} |")
    if caveated:
        lines += ["", f"{CAVEAT_MARK} with the advisor's caveat: on the fast devices alone a "
                      f"round holds at least {advise.STEPS_CHANGE:g}x fewer (or more) iterations of "
                      "the fastest device than in the gap's runs, so the samples to the target it needs were "
                      "not measured: the least certain prediction."]
    return lines


CAVEAT_MARK = "†"


def results_alone(plans: list[GapPlan], results: dict[str, dict]):
    """ESync's time on the fast devices alone (the same at every gap), or None."""
    for p in plans[1:]:
        found = results[p.name]["rows"].get(ESYNC_FAST_ALONE, {}).get("time")
        if found is not None:
            return found
    return None


def by_label(advice: dict, label: str) -> float | None:
    return next((p.time_s for name, p in advice["predictions"] if name == label), None)


def error_cell(predicted: float | None, measured) -> str:
    """(predicted - measured) / measured, from the measured median; '-' where either is
    missing or the row did not reach the target."""
    if predicted is None or measured is None or not measured.values \
            or measured.median == stats.INF:
        return "-"
    return f"{(predicted - measured.median) / measured.median:+.0%}"


def describe(args, plans: list[GapPlan], share: float | None) -> list[str]:
    """The plan in words (printed at the start, and in the report)."""
    tune = sum(len(p.tune_jobs) + len(p.confirmations) for p in plans)
    runs = sum(len(p.rows) for p in plans) * args.repeats
    cap = (f"a x1 device capped at {share:g} core at every gap, a slow one at {share:g} / G"
           if share is not None else "no CPU caps (the sleep emulation)")
    return [f"gap sweep: gaps {', '.join(f'{g:g}' for g in args.gaps)} (devices "
            f"{factors_text(FAST_FACTORS)} and {SLOW_DEVICES} x G); {cap}",
            f"gap sweep: {tune} tuning run(s) ({args.tune_budget:g} s) and {runs} full run(s) "
            f"({args.repeats} repeat(s) of {args.budget:g} s, interleaved), about "
            f"{estimate_minutes(args, plans):.0f} min"]


def estimate_minutes(args, plans: list[GapPlan]) -> float:
    jobs = [j for p in plans for j in [*p.tune_jobs, *p.confirmations]]
    for p in plans:
        jobs += plan.full_jobs(p.args, p.out, p.rows, [LOOPBACK],
                               {r.group: plan.default_lr(p.args, r) for r in p.rows})
    return plan.estimate(jobs)["total_s"] / 60


def render(args, plans, results, share, *, command: str, figure: Path | None,
           iteration_cpu_s: float, measured: bool, min_run_us: int, started: datetime,
           seconds: float, problems: list[str]) -> str:
    every_run = [j for p in plans for j in p.tune_jobs + (p.jobs or [])]
    note = resume_note(every_run)
    L = ["# The heterogeneity sweep", "",
         f"Started {started:%Y-%m-%d %H:%M}, {seconds / 60:.0f} min"
         + (" in the last invocation" if note else "") + ". Command:", "",
         f"    {command}", "", *([note[0].upper() + note[1:] + ".", ""] if note else []),
         *describe(args, plans, share), "",
         f"## Time to {args.target:g}", "",
         f"Median (min–max) over {args.repeats} repeat(s), seconds of training; each row at "
         "its tuned rate; the rows without slow devices ran once and are the same at every "
         "gap; the best per gap in bold.", "", *table(plans, results, args.target), ""]
    if figure is not None:
        L += [f"![time to target against the gap]({figure.relative_to(Path(args.out))})", ""]
    L += ["## The advisor against the sweep", "",
          f"`esync-advise` on each of a gap's ESync runs (time to {args.target:g}, s; the "
          "median of its predictions): for the whole cluster against ESync's measured median, "
          "and for the fast devices alone against ESync's measured median on them.", "",
          *advisor_rows(plans, results, args.target), ""]
    L += ["## Learning rates", "",
          "Each row's rate and momentum: the tuning's best pair" if any(p.tuning for p in plans)
          else "Each row's rate: -l/-ll (no tuning)", ""]
    for p in plans:
        pairs = plan.chosen_pairs(p.args, p.rows, p.tuning)
        L.append(f"- {p.name}: " + ", ".join(
            f"{g} {lr:g}" + (f" (momentum {m:g})" if m else "") for g, (lr, m) in pairs.items()))
    L += ["", "## CPU caps", ""]
    if share is None:
        L.append("No caps ran (the sleep emulation): a device's slow-down is a sleep, exact.")
    else:
        source = ("the runs' own x1 pace" if measured
                  else "the reference machine's (nothing measured yet)")
        coarse = coarse_gaps(args.gaps, share, iteration_cpu_s, min_run_us)
        L += [f"One x1 iteration takes {iteration_cpu_s * 1e3:.1f} ms of CPU ({source}); the "
              f"CFS bandwidth slice is {min_run_us} us. A cap is coarse where its granularity "
              f"(the throttled stretch of a period, over one iteration's wall time) exceeds "
              f"{COARSE_SHARE:.0%}: "
              + (f"at gaps {', '.join(f'{g:g}' for g in coarse)}." if coarse
                 else "at none of these gaps."), "",
              *cap_table(args.gaps, share, iteration_cpu_s, min_run_us), ""]
    if problems:
        L += ["## Problems", "", *[f"- {p}" for p in problems], ""]
    return "\n".join(L)


def to_json(plans, results) -> dict:
    def clean(value):
        if isinstance(value, (stats.Spread, stats.Speedup)):
            return value.to_json()
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in ("runs",)}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return None if isinstance(value, float) and not math.isfinite(value) else value
    return {"kept_runs": sum(1 for p in plans for j in p.tune_jobs + (p.jobs or []) if j.kept),
            "gaps": {p.name: {"gap": p.gap, "slowdown": p.args.slowdown,
                              "rates": {g: e.get("lr") for g, e in (p.tuning or {}).items()},
                              "rows": clean(results[p.name]["rows"])}
                     for p in plans[1:]}}


# ----------------------------------------------------------------------------- running it

def resolve(args) -> None:
    """``args.gaps`` and the sweep's one x1 cap (``args.cpu_share``, passed to every run).

    Every cluster run is then capped (``--emulation cpu-cap``): under ``auto`` the launcher
    caps nothing where no device is slower than x1 (gap 1, the fast devices alone), and those
    rows would compute on whole cores beside capped ones."""
    args.gaps = parse_gaps(args.gap_sweep)
    if not cluster_rows(args.mode_list):
        raise UsageError(f"argument --modes: the sweep runs {', '.join(CLUSTER_MODES)} on the "
                         f"whole cluster, and --modes {','.join(args.mode_list)} has none of "
                         "them")
    if args.cpu_share is not None:
        check_caps(args.gaps, args.cpu_share)
    if args.emulation_argv and args.emulation != "sleep" and args.cpu_share is None:
        from esync.emulation.standalone_cap import cgroups_unavailable, cores_here
        if cgroups_unavailable() is None:
            args.cpu_share = float(f"{sweep_share(args.gaps, cores_here()):.4g}")
            check_caps(args.gaps, args.cpu_share)
            args.emulation_argv += ["--cpu-share", f"{args.cpu_share:g}"]
    if args.cpu_share is not None and "--emulation" in args.emulation_argv:
        args.emulation_argv = plan.capped(args.emulation_argv, args.cpu_share)


def check_caps(gaps: list[float], share: float) -> None:
    """Refuse a gap whose slow devices' cap would fall under the kernel's smallest."""
    too_wide = [g for g in gaps if share / g < cgroups.MIN_CORES * (1 - 1e-9)]
    if too_wide:
        raise UsageError(f"argument --gap-sweep: at gap {too_wide[0]:g} a slow device's cap "
                         f"would be {share / too_wide[0]:.3g} core, under the kernel's smallest "
                         f"({cgroups.MIN_CORES:g}); leave out the gaps above "
                         f"{share / cgroups.MIN_CORES:g}, or use --emulation sleep")


@dataclass(frozen=True)
class DriverSteps:
    """The benchmark driver's steps the sweep runs as the benchmark does: passed in by the
    driver, which dispatches ``--gap-sweep`` here (so this module does not import it back)."""
    tune: Callable           # (args, out, rows, tune_jobs, progress, eta, cap) -> (jobs, tuning)
    run_all: Callable        # (jobs, progress, timeout, eta)
    eta: Callable            # (jobs) -> an Eta
    chosen_rates: Callable   # (args, rows, tuning) -> {group: rate}
    chosen_momenta: Callable  # (args, rows, tuning) -> {group: momentum}


def _stop_on_sigterm(*_):
    """A SIGTERM stops the sweep as Ctrl-C does: the run in progress is stopped first."""
    raise KeyboardInterrupt


def run(args, command: str, driver: DriverSteps) -> int:
    """The sweep from parsed benchmark options (``--gap-sweep``): plan, tune, run, report."""
    from esync.benchmark.runs import Progress
    from esync.emulation.standalone_cap import StandaloneCap
    try:
        resolve(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    args.out = str(out)
    plans = build(args, out)
    for line in describe(args, plans, args.cpu_share):
        print(f"{PROG}: {line}")
    if args.dry_run:
        for p in plans:
            for job in p.tune_jobs + plan.full_jobs(p.args, p.out, p.rows, [LOOPBACK], {
                    r.group: plan.default_lr(p.args, r) for r in p.rows}):
                print(f"[{p.name} {job.tag}] {shlex.join(plan.display_argv(job.argv))}")
        print("\n".join(cap_table(args.gaps, args.cpu_share or 1.0, REFERENCE_ITERATION_S,
                                  slice_in_force())))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    options.write_invocation(args)
    started, t0 = (args.resume and options.started_at(args)) or datetime.now(), time.monotonic()
    progress = Progress(sum(len(p.tune_jobs) + len(p.confirmations)
                            + len(p.rows) * args.repeats for p in plans))
    eta = driver.eta([j for p in plans for j in [*p.tune_jobs, *p.confirmations]])
    cap = StandaloneCap(gap_args(args, None))
    problems: list[str] = []
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        with cap:
            for p in plans:
                p.tune_jobs, p.tuning = driver.tune(p.args, p.out, p.rows, p.tune_jobs,
                                                    progress, eta, cap)
            rates = {p.name: driver.chosen_rates(p.args, p.rows, p.tuning) for p in plans}
            momenta = {p.name: driver.chosen_momenta(p.args, p.rows, p.tuning) for p in plans}
            jobs = full_jobs(plans, rates, momenta)
            eta.left += sum(eta.of(j) for j in jobs)
            cap.apply(jobs)
            driver.run_all(jobs, progress, args.job_timeout, eta)
    except KeyboardInterrupt:
        progress.close()
        print(f"{PROG}: interrupted; the run in progress was stopped; no report",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    progress.close()
    if cap.problem:
        problems.append(cap.problem)
    results = gap_results(plans, cap.share)
    measured = measured_iteration_cpu_s(results, args.batch_size, cap.share)
    figure = None
    try:
        figure = draw(plans, results, args.target, out)
    except Exception as exc:         # a bug in the figure must not cost the report
        problems.append(f"figure: {type(exc).__name__}: {exc}")
    failed = [j for p in plans for j in p.tune_jobs + (p.jobs or []) if not j.ok]
    problems += [f"{j.tag} failed ({j.error}): {j.log}" for j in failed]
    text = render(args, plans, results, cap.share, command=command, figure=figure,
                  iteration_cpu_s=measured or REFERENCE_ITERATION_S,
                  measured=measured is not None, min_run_us=slice_in_force(),
                  started=started, seconds=time.monotonic() - t0, problems=problems)
    (out / "report.md").write_text(text + "\n")
    (out / "benchmark.json").write_text(json.dumps(to_json(plans, results), indent=1) + "\n")
    print(f"{PROG}: report written to {out / 'report.md'}")
    return 1 if problems else 0
