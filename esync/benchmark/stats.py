"""Numbers over repeated runs: median and min–max, which rows clearly differ, Table 1.

One run on a shared 2-core machine is one draw from a wide distribution, so every figure the
report compares is a median over repeats (robust to the one run that another job slowed down),
shown with its min–max range; a speedup is a ratio of medians, and where the two rows' ranges
overlap the report says the difference is not clear. Plain Python, no I/O: the tests feed it
hand-made numbers.

Times to a target accuracy are censored: a run that did not reach the target within its horizon
(its training budget, or SSGD's longer cap in Table 1) took *more than* the horizon. It counts as
+inf, so it sorts after every run that reached the target: the median is "not reached" when half
the runs or more did not reach it, and a speedup over such a row is a lower bound (``>``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from esync.common import modes

INF = math.inf


@dataclass(frozen=True)
class Spread:
    """Median, min and max of one figure over the repeats that produced it.

    ``values`` are per repeat (failed runs left out); for a censored figure (time to target)
    ``inf`` stands for "not reached", and ``reached`` counts the finite values.
    """
    values: tuple[float, ...]
    censored: bool = False

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def reached(self) -> int:
        return sum(1 for v in self.values if v != INF)

    @property
    def median(self) -> float | None:
        """None when there is no value; ``inf`` for a censored median that was not reached."""
        return statistics.median(self.values) if self.values else None

    @property
    def low(self) -> float | None:
        return min(self.values) if self.values else None

    @property
    def high(self) -> float | None:
        return max(self.values) if self.values else None

    @property
    def finite_median(self) -> float | None:
        m = self.median
        return None if m is None or m == INF else m

    def to_json(self) -> dict:
        """JSON has no infinity: "not reached" is null, with ``reached`` saying how many did."""
        def clean(v):
            return None if v is None or v == INF else v
        return {"median": clean(self.median), "min": clean(self.low), "max": clean(self.high),
                "n": self.n, "reached": self.reached if self.censored else self.n,
                "values": [clean(v) for v in self.values]}


def spread(values, *, censored: bool = False) -> Spread:
    """``values`` per repeat; None is "not reached" when ``censored`` (a time to target),
    otherwise a missing figure, left out."""
    if censored:
        return Spread(tuple(INF if v is None else float(v) for v in values), censored=True)
    return Spread(tuple(float(v) for v in values if v is not None and not math.isnan(v)))


def median(values) -> float | None:
    """The median of the values that exist (None when none does)."""
    return spread(values).median


def repeat_ratio(s: Spread | None) -> float | None:
    """Slowest over fastest repeat (a time's spread); None unless two or more repeats ran and
    every one reached the target."""
    if s is None or s.n < 2 or s.reached < s.n or not s.low:
        return None
    return s.high / s.low


def paced(times, paces) -> list[float | None]:
    """Each repeat's time to target at the row's median pace: ``t * median(paces) / pace``.

    A run's pace (``metrics.x1_seconds_per_sample``) is how fast the machine's cores ran in it;
    scaling by it takes the machine's part out of a spread between repeats, and what is left is
    the runs' own (seed, timing). None where either is missing."""
    known = [p for p in paces if p]
    middle = statistics.median(known) if known else None
    return [None if t is None or not p or middle is None else t * middle / p
            for t, p in zip(times, paces)]


def paced_spread(times, paces) -> Spread | None:
    """The censored spread of ``paced`` times; None unless every repeat's pace is known
    (censoring would read a missing one as "not reached")."""
    if not paces or not all(paces):
        return None
    return spread(paced(times, paces), censored=True)


def pooled_log_sigma(groups) -> tuple[float, int] | None:
    """(standard deviation of ln(time), degrees of freedom) pooled over ``groups``, each one
    report's repeats of one row: every time is taken from its own report's mean log, so
    reports that ran at different paces or rates still pool. Spreads between times are ratios,
    hence logs. Groups with fewer than two times add nothing; None when no group has two."""
    squares, dof = 0.0, 0
    for times in groups:
        logs = [math.log(t) for t in times]
        if len(logs) < 2:
            continue
        mean = sum(logs) / len(logs)
        squares += sum((v - mean) ** 2 for v in logs)
        dof += len(logs) - 1
    return (math.sqrt(squares / dof), dof) if dof else None


def chance_within(ratio: float, sigma: float, repeats: int) -> float:
    """The chance that ``repeats`` runs of a row whose ln(time) has standard deviation ``sigma``
    stay within ``ratio`` (slowest / fastest at most ``ratio``): the range of that many normal
    draws, at most ln(ratio) / sigma standard deviations,
    P = n * integral of phi(x) * (Phi(x + w) - Phi(x))^(n - 1) dx."""
    if repeats < 2 or sigma <= 0:
        return 1.0
    w, normal, step = math.log(ratio) / sigma, statistics.NormalDist(), 0.005
    total = sum(normal.pdf(x) * (normal.cdf(x + w) - normal.cdf(x)) ** (repeats - 1) * step
                for x in (i * step for i in range(-2400, 2401)))   # -12..12: tails add nothing
    return min(1.0, repeats * total)


def overlap(a: Spread, b: Spread) -> bool:
    """Whether the min–max ranges of ``a`` and ``b`` share a point (``inf`` included: two rows
    that both missed the target in some run overlap there)."""
    if not a.values or not b.values:
        return False
    return max(a.low, b.low) <= min(a.high, b.high)


@dataclass(frozen=True)
class Speedup:
    """``reference`` median time / the row's median time.

    ``bound`` is ``"="`` (both medians reached the target), ``">"`` (the reference's median did
    not reach it within ``reference_horizon``: the speedup is at least ``value``) or ``"<"``
    (the row's median did not: at most ``value``). ``overlap``: the two ranges overlap, so the
    difference is within what repeats vary by.
    """
    value: float
    bound: str
    overlap: bool
    other: str | None = None     # the row compared with ("vs best other")

    def text(self) -> str:
        prefix = "" if self.bound == "=" else f"{self.bound} "
        return f"{prefix}{self.value:.2f}×"

    def verdict(self) -> str:
        """The overlap note, or "" when the ranges are apart."""
        if not self.overlap:
            return ""
        if self.bound == "<" or (self.bound == "=" and self.value < 1):
            return "ranges overlap: not a clear loss"
        return "ranges overlap: not a clear win"

    def to_json(self) -> dict:
        return {"value": self.value, "bound": self.bound, "overlap": self.overlap,
                "other": self.other}


def speedup(row: Spread, reference: Spread, *, row_horizon: float | None,
            reference_horizon: float | None, other: str | None = None) -> Speedup | None:
    """How many times faster than ``reference`` the row reaches the target, from medians.

    None when neither median reached it, or a horizon needed for a bound is unknown.
    """
    r, ref = row.median, reference.median
    if r is None or ref is None:
        return None
    both = overlap(row, reference)
    if r != INF and ref != INF:
        return Speedup(ref / r, "=", both, other) if r > 0 else None
    if r != INF and ref == INF and reference_horizon and r > 0:
        return Speedup(reference_horizon / r, ">", both, other)
    if r == INF and ref != INF and row_horizon:
        return Speedup(ref / row_horizon, "<", both, other)
    return None


# ----------------------------------------------------------------------------- rows

def row_split(name: str):
    return modes.parse_folder(name)[1]


def best_other(name: str, times: dict[str, Spread]) -> str | None:
    """The fastest row (smallest median reaching the target) of another mode, on the same data
    split or one device alone; None when no such row reached the target."""
    family, split = modes.family(name), row_split(name)
    candidates = [(t.finite_median, i, other) for i, (other, t) in enumerate(times.items())
                  if modes.family(other) != family and t.finite_median is not None
                  and (row_split(other) == split or modes.family(other) == modes.STANDALONE)]
    return min(candidates)[2] if candidates else None


def baseline_of(name: str, names) -> str | None:
    """SSGD's row on the same data split (None for SSGD itself or when it did not run)."""
    if modes.family(name) == modes.BASELINE:
        return None
    wanted = modes.BASELINE + row_split(name).suffix
    return wanted if wanted in names else None


def aggregate(per_rep: dict[str, list[dict | None]], *,
              horizon: float | dict[str, float]) -> dict[str, dict]:
    """Per row: spreads and medians over its successful repeats, and its speedups over SSGD
    and over the best other row, all from medians.

    ``horizon``: the budget every row had, or each row's (by-class rows run longer).

    ``per_rep[name]`` holds one metrics dict per repeat (None: the run failed) with at least
    ``time_to_target`` (None: not reached within ``horizon``), ``final_accuracy``,
    ``throughput``, ``mean_computing_time_ratio`` and ``traffic_bytes_per_s``; with
    ``x1_seconds_per_sample`` in every repeat also ``paced_time`` (``paced``).
    """
    def horizon_of(name):
        return horizon.get(name) if isinstance(horizon, dict) else horizon

    ok = {n: [m for m in reps if m is not None] for n, reps in per_rep.items()}
    times = {n: spread([m.get("time_to_target") for m in ms], censored=True)
             for n, ms in ok.items() if ms}
    paces = {n: [m.get("x1_seconds_per_sample") for m in ms] for n, ms in ok.items()}
    found = {}
    for name, ms in ok.items():
        entry = {"runs": len(per_rep[name]), "ok": len(ms)}
        if ms:
            entry.update(
                time=times[name],
                pace=spread(paces[name]),
                paced_time=paced_spread([m.get("time_to_target") for m in ms], paces[name]),
                accuracy=spread([m.get("final_accuracy") for m in ms]),
                late_accuracy=spread([m.get("late_accuracy") for m in ms]),
                throughput=median([m.get("throughput") for m in ms]),
                throughput_fraction=median([m.get("throughput_fraction") for m in ms]),
                computing_time_ratio=median([m.get("mean_computing_time_ratio") for m in ms]),
                traffic_bytes_per_s=median([m.get("traffic_bytes_per_s") for m in ms]),
                exchange_bytes=median([m.get("exchange_bytes") for m in ms]),
                server_bytes_per_round=median([m.get("server_bytes_per_round") for m in ms]),
                worker_link_bytes_per_round=median([m.get("worker_link_bytes_per_round")
                                                    for m in ms]),
                server_link_bytes_per_round=median([m.get("server_link_bytes_per_round")
                                                    for m in ms]),
                state_requests_per_round=median([m.get("state_requests_per_round")
                                                 for m in ms]))
            base = baseline_of(name, times)
            entry["vs_sync"] = None if base is None else speedup(
                times[name], times[base], row_horizon=horizon_of(name),
                reference_horizon=horizon_of(base), other=base)
            other = best_other(name, times)
            entry["vs_best_other"] = None if other is None else speedup(
                times[name], times[other], row_horizon=horizon_of(name),
                reference_horizon=horizon_of(other), other=other)
        found[name] = entry
    return found


def table1(per_rep: dict[str, list[dict | None]], *, budget: float,
           sync_cap: float) -> list[dict]:
    """The paper's Table 1 for one network setting: per i.i.d. row, the time to Table 1's
    target (median and range) and the speedup over SSGD, SSGD having run until the target or
    ``sync_cap`` seconds (``time_to_table1_uncut``), every other row within ``budget``.

    Rows: ``{"name", "time": Spread, "horizon", "vs_sync": Speedup | None}``, SSGD first.
    """
    rows = []
    names = [n for n in per_rep if row_split(n).value == 0]
    names.sort(key=lambda n: modes.family(n) != modes.BASELINE)
    times = {}
    for name in names:
        ms = [m for m in per_rep[name] if m is not None]
        if not ms:
            continue
        # SSGD's whole-cluster parameter-server row ran on past the budget; its other rows
        # (the fast devices alone, Horovod's) kept the budget like every other row
        sync = name == modes.BASELINE
        key = "time_to_table1_uncut" if sync else "time_to_table1"
        times[name] = (spread([m.get(key) for m in ms],
                              censored=True), sync_cap if sync else budget)
    base = modes.BASELINE if modes.BASELINE in times else next(
        (n for n in times if modes.family(n) == modes.BASELINE), None)
    for name, (t, horizon) in times.items():
        vs = None
        if base is not None and name != base:
            vs = speedup(t, times[base][0], row_horizon=horizon,
                         reference_horizon=times[base][1], other=base)
        rows.append({"name": name, "time": t, "horizon": horizon, "vs_sync": vs})
    return rows


# ----------------------------------------------------------------------------- cells

def time_cell(t: Spread | None, horizon: float | None = None) -> str:
    """``"31.2 (28.0–35.1)"``; ``"not reached"`` with how many repeats did; one value alone."""
    if t is None or not t.values:
        return "n/a"
    within = f" in {horizon:g} s" if horizon else ""
    if t.median == INF:
        if t.reached:
            return f"not reached{within} ({t.reached}/{t.n} runs did; fastest {t.low:.1f})"
        return f"not reached{within}"
    if t.n == 1:
        return f"{t.median:.1f}"
    high = "not reached" if t.high == INF else f"{t.high:.1f}"
    extra = "" if t.reached == t.n else f"; {t.reached}/{t.n} reached"
    return f"{t.median:.1f} ({t.low:.1f}–{high}{extra})"


def value_cell(s: Spread | None, spec: str) -> str:
    """``"0.861 (0.850–0.873)"``: the median and the range (one value alone)."""
    if s is None or not s.values:
        return "n/a"
    if s.n == 1:
        return format(s.median, spec)
    return f"{format(s.median, spec)} ({format(s.low, spec)}–{format(s.high, spec)})"


def speedup_cell(s: Speedup | None, labels: dict | None = None, *,
                 name_other: bool = False) -> str:
    """``"1.50×"``, ``"> 2.00×"``, ``"0.93× (over ASGD; ranges overlap: not a clear loss)"``."""
    if s is None:
        return "n/a"
    notes = []
    if name_other and s.other is not None:
        notes.append(f"over {(labels or {}).get(s.other, s.other)}")
    if s.verdict():
        notes.append(s.verdict())
    return s.text() + (f" ({'; '.join(notes)})" if notes else "")
