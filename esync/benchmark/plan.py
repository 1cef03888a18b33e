"""Which runs the benchmark makes: rows (a mode, its variant, a data split), settings (a network
setting, or a scenario such as the shifting one), tuning runs and full runs, each with its command
line, seed, log folder and environment, and how long they should take."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from esync.benchmark import options, own_machines
from esync.common import modes
from esync.common.procs import REPO, python_env

MAIN = REPO / "main.py"
# Checkpoint (and so evaluation) interval in rounds: a sync or ESync round waits for the slowest
# device, an async "round" is one iteration of rank 0 (a fast device), so async checkpoints
# every 40 iterations to score about as often in time (~1.5 s on the default cluster) and keep
# the evaluator's work, which shares the CPU with the workers, alike across modes.
# Every cluster run checkpoints (and so is scored) on one grid in time: every 4 s of training
# (-e 4s: the first round, or rank 0's iteration, ending 4 s or more after the last). A grid in
# rounds is not one in time: ESync's stretched rounds last 2-5 s, and ASGD's rank 0 (whichever
# device ps-lite ranks first) iterates 8x slower on the x8 device than on a x1, so "every 40
# iterations" was 2.5 s in one run and 13 s in the next, and time to target moved with it.
CLUSTER_EVAL = "4s"
RUNS_DIR = "runs"             # captured output of every launcher / main.py subprocess
TUNE_DIR = "tune"
SHIFTING = "shifting"         # the scenario (and its setting's name) where a device slows down
# In the shifting scenario the fastest device after the first becomes this many times slower
# at --shift-at (a quarter of the budget): a fast machine that another job starts using.
SHIFT_FACTOR = 6
SHIFT_MODES = ("esync", "sync", "async")
SHIFT_POLICIES = ("dynamic", "planned")

# Seconds a run takes beyond its budget (start-up, the evaluator's catch-up, the summary), as
# measured in a full benchmark on a slow machine (docs/BENCHMARK.md, "Budget": 2 cores,
# CPU caps; the means of its runs' seconds minus their budgets; 29.8 ms per iteration on one
# free core). Most of it is eight processes importing MXNet at once on two cores, so it grows
# with a slower machine: on faster ones the same means were 7.9, 11.3 and 8.3 s (19.7 ms,
# earlier default benchmarks, in git history) and 10.2, 14.8 and 8.9 s (24.7 ms); the slow
# machine's keep the estimate on the safe side. A standalone run also scores the test set
# inline every -e iterations, which its training-time budget leaves out: 6.7 s over a 10 s
# budget, 19.0 s over 40 s, i.e. 3 s plus 0.4 of the budget.
OVERHEAD_S = {"loopback": 11.2, "netns": 15.5, "tune": 12.4}
STANDALONE_OVERHEAD_S = (3.0, 0.4)      # fixed seconds, fraction of the budget
FIXED_OVERHEAD_S = 30.0                 # measuring the shaped rate, the report, the figures


@dataclass(frozen=True)
class Row:
    """One line of the report: a registry mode, its variant and a data split."""
    name: str                 # esync-fednova-niid, sync, local, ...
    label: str                # ESync (fednova) (non-i.i.d.)
    mode: str                 # registry mode name
    split: int                # -s
    extra: tuple[str, ...] = ()   # launcher flags of the variant (--aggregation, --policy ...)
    group: str = ""           # tuning group: rows of one group share a learning rate
    scenario: str = "static"  # static | shifting: which settings the row runs in
    momentum: float = 0.0     # main.py --momentum (every mode but ESync; from the tuning)
    chooses_for: str = ""     # a momentum's tuning group: the row group it is a candidate of
    devices: tuple[int, ...] = ()   # the cluster's devices it runs on (empty: all of them)

    @property
    def choice_group(self) -> str:
        """The row group whose (rate, momentum) pair this tuning group competes for."""
        return self.chooses_for or self.group

    @property
    def lr_flag(self) -> str:
        """ESync tunes its local steps' rate; every other mode its SGD rate."""
        return "-ll" if self.mode == "esync" else "-l"


@dataclass(frozen=True)
class Setting:
    """Where rows run: a network setting of the static scenario (loopback, or namespaces with
    shaped links), or the shifting scenario (loopback with a speed schedule)."""
    name: str                 # loopback | netns | shifting
    label: str
    argv: tuple[str, ...] = ()
    scenario: str = "static"
    switch_s: float | None = None   # shifting: when the device slows down (training seconds)


@dataclass
class Job:
    row: Row
    setting: Setting
    rep: int                  # 1-based; 0 for tuning runs
    lr: float
    root: Path                # log root (-ld)
    folder: Path              # the mode folder the run writes
    argv: list[str]
    log: Path
    budget: float
    seed: int = 0
    extended: bool = False    # SSGD running past the budget to the target (Table 1)
    prefix: list[str] = field(default_factory=list)   # e.g. the CPU cap's exec prefix
    env: dict = field(default_factory=dict)            # added to child_env (one thread ...)
    returncode: int | None = None
    seconds: float = 0.0
    error: str | None = None
    summary: dict | None = field(default=None, repr=False)
    tuning_seed: int = 0      # the grid's seed (a tuning run with another one confirms a rate)
    resume: bool = False      # --resume: keep this run if an earlier invocation finished it
    kept: str | None = None   # kept so (``runs.run_job``), not run now: when it had finished

    @property
    def tuning(self) -> bool:
        return self.rep == 0

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def tag(self) -> str:
        if self.tuning:
            return f"tune {self.row.group} lr {self.lr:g}" + (
                f" seed {self.seed}" if self.seed and self.seed != self.tuning_seed else "")
        return f"rep {self.rep} {self.setting.name} {self.row.name}"

    @property
    def standalone(self) -> bool:
        return not modes.get(self.row.mode).cluster

    @property
    def ok(self) -> bool:
        return self.error is None and self.summary is not None


def policies(args) -> list[str]:
    return ["dynamic", "planned"] if args.policy == "both" else [args.policy]


def rows(args) -> list[Row]:
    """Every row in report order: with the static scenario, i.i.d. rows, then by-class rows of
    the cluster modes (each (mode, variant, split) a tuning group of its own); then the rows of
    the shifting scenario."""
    found = []
    scenarios = getattr(args, "scenario_list", ["static"])
    for split_value in args.splits if "static" in scenarios else []:
        split = modes.split(split_value)
        for name in args.mode_list:
            mode = modes.get(name)
            if split_value and not mode.cluster:
                continue
            aggregations = args.byclass_aggregation_list if split_value else \
                args.aggregation_list
            for base, label, extra in _variants(args, mode, aggregations):
                # A row's best rate on by-class data is not its i.i.d. one: its own group. Over
                # the allreduce a row computes what its ps row does: it shares that row's rate.
                group = base + split.suffix
                for collective in _collectives(args, mode):
                    suffix = "" if collective == "ps" else f"-{collective}"
                    found.append(Row(name=base + suffix + split.suffix,
                                     label=label + COLLECTIVE_LABELS[collective]
                                     + (f" ({split.label})" if split.label else ""),
                                     mode=name, split=split_value,
                                     extra=tuple(extra) + (() if collective == "ps" else
                                                           ("--collective", collective)),
                                     group=group))
        if not split_value:
            found += alternative_rows(args, found)
    if SHIFTING in scenarios:
        found += shifting_rows(args)
    return found


# What a row's label adds for its collective (the parameter server is the default).
COLLECTIVE_LABELS = {"ps": "", "allreduce": " over Horovod allreduce"}


def _collectives(args, mode: modes.Mode) -> list[str]:
    """The collectives of --collectives a mode runs over (ps alone for the async modes)."""
    wanted = getattr(args, "collective_list", ["ps"])
    found = [c for c in wanted if c in mode.collectives]
    return found or ["ps"]


FAST_SUFFIX = "-fast"         # a row on the fast devices alone
FAST_MODES = ("sync", "async")   # the modes a user without ESync runs on the fast devices


def alternative_rows(args, found: list[Row]) -> list[Row]:
    """The i.i.d. rows of what a user without ESync would run: SSGD and ASGD on the fast
    devices alone (``--fast-devices``; each its own tuning group, as fewer devices sum a
    smaller gradient), and Horovod's SSGD (``--horovod``) on the whole cluster and on the fast
    devices, tuned with SSGD's ps row of the same devices (it computes what that row does)."""
    fast = tuple(getattr(args, "fast_list", ()))
    names = {row.name for row in found}
    more = []
    devices = ", ".join(f"cpu{i}" for i in fast)
    for name in (m for m in FAST_MODES if m in args.mode_list and fast):
        mode = modes.get(name)
        more.append(Row(name=name + FAST_SUFFIX, label=f"{mode.label}, fast devices alone "
                        f"({devices})", mode=name, split=0, group=name + FAST_SUFFIX,
                        devices=fast))
    if getattr(args, "horovod_rows", False):
        horovod = ("--collective", "allreduce")
        label = modes.get(modes.BASELINE).label + COLLECTIVE_LABELS["allreduce"]
        whole = modes.BASELINE + "-allreduce"
        if whole not in names:
            more.append(Row(name=whole, label=label, mode=modes.BASELINE, split=0,
                            extra=horovod, group=modes.BASELINE))
        if fast:
            more.append(Row(name=whole + FAST_SUFFIX, label=f"{label}, fast devices alone "
                            f"({devices})", mode=modes.BASELINE, split=0, extra=horovod,
                            group=modes.BASELINE + FAST_SUFFIX, devices=fast))
    return more


def tuning_rows(args, all_rows: list[Row]) -> list[Row]:
    """Each tuning group's row, then (every mode but ESync, whose outer step is its point of
    the grid) one more group per momentum of ``--tune-momentum`` above 0, competing for the
    same row (``chooses_for``): ``sync`` is SGD's group, ``sync-momentum0.9`` its 0.9's."""
    found = []
    for row in _first_row_by_group(all_rows).values():
        if row.mode == "esync":
            found.append(row)
            continue
        for momentum in getattr(args, "momentum_grid", [0.0]):
            found.append(row if not momentum else replace(
                row, group=momentum_group(row.group, momentum), momentum=momentum,
                chooses_for=row.group))
    return found


def momentum_group(group: str, momentum: float) -> str:
    """The tuning group of a row group's runs with ``momentum``."""
    base, split = modes.parse_folder(group)
    return f"{base}-momentum{momentum:g}{split.suffix}"


def shifting_rows(args) -> list[Row]:
    """ESync under each policy (with the first rule of --aggregations), SSGD and ASGD, i.i.d.:
    those of --modes. Each reuses the learning rate of its static row (the same algorithm on the
    same data; only the speeds change)."""
    found = []
    for name in (m for m in SHIFT_MODES if m in args.mode_list):
        mode = modes.get(name)
        if name != "esync":
            found.append(Row(name=name, label=mode.label, mode=name, split=0, group=name,
                             scenario=SHIFTING))
            continue
        agg = args.aggregation_list[0]
        flags = agg.argv() if args.aggregation_flags else []
        static = f"esync-{agg.slug}"
        for policy in SHIFT_POLICIES:
            group = static + (f"-{policy}" if args.policy == "both" else "")
            found.append(Row(name=f"{static}-{policy}",
                             label=f"{mode.label} ({agg.label}, {policy} policy)", mode=name,
                             split=0, extra=tuple(flags + ["--policy", policy]), group=group,
                             scenario=SHIFTING))
    return found


def _variants(args, mode: modes.Mode, aggregations) -> list[tuple[str, str, list[str]]]:
    """(row base name, label, extra launcher flags) of one mode (ESync: one per aggregation)."""
    if mode.name != "esync":
        return [(mode.name, mode.label, [])]
    variants = []
    both = args.policy == "both"
    for agg in aggregations:
        flags = agg.argv() if args.aggregation_flags else []
        for policy in policies(args):
            name = f"esync-{agg.slug}" + (f"-{policy}" if both else "")
            label = f"{mode.label} ({agg.label}" + (f", {policy} policy)" if both else ")")
            variants.append((name, label, flags + ["--policy", policy]))
    return variants


LOOPBACK = Setting("loopback", "loopback (free networking)")


def settings(args, rates: dict | None) -> list[Setting]:
    """The settings to run, in report order: the network settings of the static scenario
    (``rates`` from ``shaping`` for netns), then the shifting scenario (loopback)."""
    found = []
    scenarios = getattr(args, "scenario_list", ["static"])
    for net in args.net_list if "static" in scenarios else []:
        if net == "loopback":
            machines = getattr(args, "machines", None)
            found.append(Setting(own_machines.SETTING_NAME, machines.setting_label) if machines
                         else LOOPBACK)
            continue
        worker_rates, server_rate = rates["worker"], rates["server"]
        argv = ["--net", "netns", "--bandwidth", ",".join(worker_rates),
                "--server-bandwidth", server_rate]
        if args.hosts:
            argv += ["--hosts", args.hosts]
        found.append(Setting("netns", f"shaped links ({','.join(worker_rates)} per worker "
                                      f"host, {server_rate} at the server)", tuple(argv)))
    if SHIFTING in scenarios:
        device, spec, switch = shift_schedule(args)
        found.append(Setting(SHIFTING, f"loopback, i.i.d.; device {device} becomes "
                                       f"{SHIFT_FACTOR}× slower after {switch:g} s",
                             ("--speed-schedule", spec), scenario=SHIFTING, switch_s=switch))
    return found


def shift_schedule(args) -> tuple[str, str, float]:
    """(device, --speed-schedule value, switch time): the fastest device after the first (the
    second x1 device of 1,1,4,8: cpu1) runs at its factor F, then at SHIFT_FACTOR x F from
    ``--shift-at`` on."""
    factors = args.slowdowns
    index = min(range(1, len(factors)), key=lambda i: (factors[i], i)) if len(factors) > 1 else 0
    f, switch = factors[index], args.shift_at
    device = f"cpu{index}"
    return device, f"{device}:{f:g}@0,{f * SHIFT_FACTOR:g}@{switch:g}", switch


def tuning_jobs(args, out: Path, all_rows: list[Row], setting: Setting = LOOPBACK) -> list[Job]:
    """A short run of every tuning group with each grid value, on loopback (the shaped-link
    rows and the shifting scenario reuse the value), with the seed of the first repeat."""
    if args.lr_grid is None:
        return []
    jobs = []
    for row in tuning_rows(args, all_rows):
        for lr in lr_grid(args, row):
            root = out / TUNE_DIR / row.group / f"lr{lr:g}"
            jobs.append(_job(args, row, setting, 0, lr, root, tune_budget(args, row),
                             out / RUNS_DIR / f"tune-{row.group}-lr{lr:g}.log"))
    return jobs


def _first_row_by_group(all_rows: list[Row]) -> dict[str, Row]:
    """Each tuning group's first row: the one its tuning runs run."""
    found: dict[str, Row] = {}
    for row in all_rows:
        found.setdefault(row.group, row)
    return found


MAX_WIDENINGS = 3      # extra grid values a group may get on each side of the grid


def widening_jobs(args, out: Path, all_rows: list[Row], tuning: dict) -> list[Job]:
    """One more tuning run for every group whose best rate sits at an edge of the rates it
    tried: the next value beyond that edge, a grid step away (the grid's own ratio; x3 for a
    grid of one value), with the budget of the runs that decide (a lengthened group's longer
    ones) and every seed the best rate's score averages (after ``confirming_jobs``: two; three
    for one device alone), so
    that the new value's score is a mean over the same seeds. None when every best rate is
    inside its group's values (or a group has been widened ``MAX_WIDENINGS`` times on that
    side). A group waiting to be lengthened (``undecided``) is not widened: its short runs
    cannot rank its rates yet."""
    if not args.lr_grid:
        return []
    rows_by_group = _first_row_by_group(tuning_rows(args, all_rows))
    winners = set(best_groups(tuning, rows_by_group).values())
    jobs = []
    for group, entry in tuning.items():
        tried = sorted({*entry["scores"], *(entry.get("short_scores") or {})})
        best = entry["lr"]
        row = rows_by_group.get(group)
        if best is None or len(tried) < 2 or row is None or undecided(row, entry) \
                or group not in winners:
            continue
        grid = lr_grid(args, row)
        step = (grid[-1] / grid[0]) ** (1 / (len(grid) - 1)) if len(grid) > 1 else 3.0
        if best == tried[-1] and sum(lr > grid[-1] for lr in tried) < MAX_WIDENINGS:
            lr = best * step
        elif best == tried[0] and sum(lr < grid[0] for lr in tried) < MAX_WIDENINGS:
            lr = best / step
        else:
            continue
        lr = float(f"{lr:.3g}")
        budget = max(tune_budget(args, row), entry.get("budget") or 0.0)
        lengthened = budget > tune_budget(args, row)
        name = f"lr{lr:g}" + (f"-{budget:g}s" if lengthened else "")
        seeds = max(1, (entry.get("seeds") or {}).get(best, 1))
        for seed in range(args.seed, args.seed + seeds):
            root, log = _tuning_paths(args, out, group, name, seed)
            jobs.append(_job(args, row, LOOPBACK, 0, lr, root, budget, log, seed=seed))
    return jobs


# A by-class group whose best short run scored below this mean accuracy has barely left chance
# (0.1 for ten classes): its runs cannot rank rates yet. ESync's -s 1 rule, one accumulated step
# per round, sat at chance for the first 20-25 s of its 40 s runs at every rate with the
# 0.505-core x1 devices, and its choice was noise (two default benchmarks, docs/BENCHMARK.md
# "Learning rates": 3e-05 by 0.194 against 0.159; 9.49e-05 by 0.184 against 0.164). Over 80 s
# the same two rates were apart (3e-05 0.323, 9.49e-05 0.204), and 3e-05 then ended highest.
UNDECIDED_SCORE = 0.25
LENGTHENED_RATES = 2    # how many of such a group's best rates run again, ...
LENGTHENING = 2.0       # ... for this many times the tuning budget


def undecided(row: Row, entry: dict) -> bool:
    """Whether a by-class group's short runs all stayed under ``UNDECIDED_SCORE`` and it has
    not yet been lengthened: its rates are still to be ranked by longer runs."""
    if not row.split or entry.get("short_scores"):
        return False
    scores = [score for score in entry["scores"].values() if score is not None]
    return bool(scores) and max(scores) < UNDECIDED_SCORE


def lengthening_jobs(args, out: Path, all_rows: list[Row], tuning: dict) -> list[Job]:
    """Longer tuning runs (``LENGTHENING`` x the budget, seed as before) of the
    ``LENGTHENED_RATES`` best rates of every ``undecided`` by-class group; once run, a group's
    longest runs decide (``best_learning_rates``), and may widen its grid in turn. Rows that
    learn within the short runs keep their choice, and their runs; a group is lengthened
    once."""
    if not tuning:
        return []
    rows_by_group = _first_row_by_group(tuning_rows(args, all_rows))
    jobs = []
    for group, entry in tuning.items():
        row = rows_by_group.get(group)
        if row is None or not undecided(row, entry):
            continue
        known = sorted(((score, lr) for lr, score in entry["scores"].items()
                        if score is not None), key=lambda pair: (-pair[0], pair[1]))
        budget = tune_budget(args, row) * LENGTHENING
        for _, lr in known[:LENGTHENED_RATES]:
            root = out / TUNE_DIR / group / f"lr{lr:g}-{budget:g}s"
            jobs.append(_job(args, row, LOOPBACK, 0, lr, root, budget,
                             out / RUNS_DIR / f"tune-{group}-lr{lr:g}-{budget:g}s.log"))
    return jobs


CONFIRMED_RATES = 2     # per tuning group, its best rates run again with the next seed
# ... but not a by-class group's: its runs are longer (4 times by default), and a second seed
# for them would take the default benchmark past 100 minutes. On by-class data a rate too large for the split
# sits at chance already in the first seed; and one seed's 40 s run chose every rate that the
# 60 s runs of two seeds chose (docs/benchmark-byclass-s1-tune60, cut at 40 s).
BYCLASS_CONFIRMED_RATES = 0
# One device alone confirms with two more seeds, not one: its runs are a fifth of a cluster run's
# cost, and it is every "vs one device" speedup's denominator. In the default benchmarks of
# 2026-11-28, noon and afternoon, its grid chose 0.01 on seeds 1 and 2 (10 s runs: 0.786 against
# 0.003's 0.772), and at 0.01 the seed-3 repeat diverged in both; over seeds 1-5 at 40 s, 0.01
# diverged in 2 of 5 and reached 0.85 in none, 0.003 in all 5 (34.5 s, 34.4-37.1).
STANDALONE_CONFIRMING_SEEDS = 2


def confirming_jobs(args, out: Path, all_rows: list[Row], tuning: dict) -> list[Job]:
    """A second short run, with the next seed, of each group's best rates (``confirmed_rates``:
    ``CONFIRMED_RATES`` of an i.i.d. group, none of a by-class group).

    One seed cannot tell the best rate from one that diverges in another seed: standalone SGD
    at 0.0095 won its grid on seed 1 in two default benchmarks, then ended at chance in the
    seed-2 repeat of both. A rate's score is then the mean over its seeds. One device alone
    runs its best rates with ``STANDALONE_CONFIRMING_SEEDS`` more seeds (the next ones)."""
    if not tuning:
        return []
    rows_by_group = _first_row_by_group(tuning_rows(args, all_rows))
    candidates: dict[str, list[tuple[float, int, float, str]]] = {}
    for order, (group, entry) in enumerate(tuning.items()):
        if group not in rows_by_group:
            continue
        candidates.setdefault(rows_by_group[group].choice_group, []).extend(
            (-score, order, lr, group) for lr, score in entry["scores"].items()
            if score is not None)
    jobs = []
    for known in (k for k in candidates.values() if k):
        how_many = confirmed_rates(rows_by_group[known[0][3]])
        for _, _, lr, group in sorted(known)[:how_many]:
            row = rows_by_group[group]
            for seed in confirming_seeds(args, row):
                root, log = _tuning_paths(args, out, group, f"lr{lr:g}", seed)
                jobs.append(_job(args, row, LOOPBACK, 0, lr, root, tune_budget(args, row), log,
                                 seed=seed))
    return jobs


def best_groups(tuning: dict, rows_by_group: dict[str, Row]) -> dict[str, str]:
    """``{row group: the tuning group of its best pair}``: of a row's momenta, the one whose
    best rate scored highest (the first of ``--tune-momentum`` on a tie)."""
    best: dict[str, tuple[float, str]] = {}
    for group, entry in tuning.items():
        row = rows_by_group.get(group)
        if row is None or entry.get("lr") is None:
            continue
        score = entry["scores"].get(entry["lr"])
        score = -1.0 if score is None else score
        if row.choice_group not in best or score > best[row.choice_group][0]:
            best[row.choice_group] = (score, group)
    return {choice: group for choice, (_, group) in best.items()}


def chosen_pairs(args, all_rows: list[Row], tuning: dict | None) -> dict[str, tuple]:
    """Each row group's (learning rate, momentum): its best tuning group's best rate with that
    group's momentum; -l/-ll and no momentum where nothing was tuned (or every run failed)."""
    rows_by_group = _first_row_by_group(tuning_rows(args, all_rows))
    winners = best_groups(tuning or {}, rows_by_group)
    pairs = {}
    for row in all_rows:
        group = winners.get(row.group)
        if group is None:
            pairs.setdefault(row.group, (default_lr(args, row), 0.0))
        else:
            pairs.setdefault(row.group, (tuning[group]["lr"], rows_by_group[group].momentum))
    return pairs


def describe_seeds(jobs: list[Job]) -> str:
    """The seeds confirming runs use, for the progress line and the plan: "seed 2", or
    "seed 2 (one device alone also 3)"."""
    cluster = sorted({j.seed for j in jobs if not j.standalone})
    alone = sorted({j.seed for j in jobs if j.standalone} - set(cluster))
    text = "seed " + ", ".join(map(str, cluster or alone))
    if cluster and alone:
        text += f" (one device alone also {', '.join(map(str, alone))})"
    return text


def confirming_seeds(args, row: Row) -> list[int]:
    """The seeds a group's best rates run again with: the next one, and one more for one
    device alone (``STANDALONE_CONFIRMING_SEEDS``)."""
    more = 1 if modes.get(row.mode).cluster else STANDALONE_CONFIRMING_SEEDS
    return [args.seed + i for i in range(1, more + 1)]


def _tuning_paths(args, out: Path, group: str, name: str, seed: int) -> tuple[Path, Path]:
    """A tuning run's folder and log: ``name`` (its rate, and budget if lengthened), with the
    seed appended when it is not the grid's."""
    suffix = "" if seed == args.seed else f"-seed{seed}"
    return (out / TUNE_DIR / group / f"{name}{suffix}",
            out / RUNS_DIR / f"tune-{group}-{name}{suffix}.log")


def confirmed_rates(row: Row) -> int:
    """How many of a group's best rates run again with the next seed."""
    return BYCLASS_CONFIRMED_RATES if row.split else CONFIRMED_RATES


def planned_confirmations(args, out: Path, all_rows: list[Row]) -> list[Job]:
    """The confirming runs the plan will add once the grid has run (for the estimate): which
    rates they run is not known before, their number and budgets are."""
    if args.lr_grid is None:
        return []
    rows_by_group = _first_row_by_group(tuning_rows(args, all_rows))
    return confirming_jobs(args, out, all_rows,
                           {g: {"scores": {lr: 0.0 for lr in lr_grid(args, row)}}
                            for g, row in rows_by_group.items()})


def full_jobs(args, out: Path, all_rows: list[Row], all_settings: list[Setting],
              lrs: dict[str, float], momenta: dict[str, float] | None = None) -> list[Job]:
    """Per repeat (seed, seed + 1, ...; --same-seed: seed each time): every row in every setting of its scenario; standalone
    and by-class rows in the first network setting only. SSGD's i.i.d. runs of the static
    scenario go on past the budget until the target or --sync-cap-seconds (Table 1)."""
    jobs = []
    first = next((s.name for s in all_settings if s.scenario == "static"), None)
    for rep in range(1, args.repeats + 1):
        for setting in all_settings:
            for row in all_rows:
                if row.scenario != setting.scenario:
                    continue
                if setting.name != first and setting.scenario == "static" and (
                        not modes.get(row.mode).cluster or row.split):
                    continue
                root = out / setting.name / f"rep{rep}" / row.name
                extended = (setting.scenario == "static" and row.mode == modes.BASELINE
                            and not row.split and options.sync_cap(args) > args.budget
                            and table1_row(row))
                row = replace(row, momentum=(momenta or {}).get(row.group, 0.0))
                jobs.append(_job(args, row, setting, rep, lrs[row.group], root,
                                 options.sync_cap(args) if extended else row_budget(args, row),
                                 out / RUNS_DIR / f"{setting.name}-rep{rep}-{row.name}.log",
                                 extended=extended))
    return jobs


def table1_row(row: Row) -> bool:
    """Whether an SSGD row is Table 1's, run past the budget to the target: the whole cluster's
    over the parameter server (the fast-devices and Horovod rows are alternatives, compared
    within the budget like the others)."""
    return not row.devices and "--collective" not in row.extra


def row_budget(args, row: Row) -> float:
    """A full run's training seconds: --byclass-budget for a by-class row, else --budget."""
    return args.byclass_budget if row.split else args.budget


def lr_grid(args, row: Row) -> list[float]:
    """The learning rates a row is tuned over: --byclass-tune-lr's for a by-class row (its
    parser already resolved ``same`` to the i.i.d. grid), --tune-lr otherwise."""
    rates = options.byclass_grid(args, row.mode) if row.split else args.lr_grid
    return options.momentum_rates(rates, row.momentum)


def tune_budget(args, row: Row) -> float:
    """A tuning run's training seconds: --byclass-tune-budget for a by-class row."""
    return args.byclass_tune_budget if row.split else args.tune_budget


def sync_target(args) -> float:
    """Where SSGD's longer runs stop: once they have reached both targets (the comparisons'
    --target and Table 1's --table1-target)."""
    return max(args.target, args.table1_target)


def default_lr(args, row: Row) -> float:
    return args.local_lr if row.lr_flag == "-ll" else args.learning_rate


def _job(args, row, setting, rep, lr, root, budget, log, extended=False,
         seed: int | None = None) -> Job:
    """``seed``: the run's seed (default: the repeat's; tuning runs the first repeat's)."""
    mode = modes.get(row.mode)
    folder = root / args.network / modes.folder_name(mode.cli_mode, mode.dcasgd, row.split)
    seed = options.repeat_seeds(args)[max(rep, 1) - 1] if seed is None else seed
    target = sync_target(args) if extended else None
    return Job(row=row, setting=setting, rep=rep, lr=lr, root=root, folder=folder,
               argv=job_argv(args, row, setting, lr, root, budget, seed=seed,
                             target_accuracy=target),
               log=log, budget=budget, seed=seed, extended=extended, tuning_seed=args.seed,
               resume=getattr(args, "resume", False))


def job_argv(args, row: Row, setting: Setting, lr: float, root: Path, budget: float, *,
             seed: int | None = None, target_accuracy: float | None = None) -> list[str]:
    mode = modes.get(row.mode)
    common = ["-n", args.network, "-b", str(args.batch_size), row.lr_flag, f"{lr!r}",
              "-ld", str(root), "--seed", str(args.seed if seed is None else seed),
              "-dd", str(args.data_dir), *momentum_argv(args, row)]
    if not mode.cluster:
        # The same training time as the cluster runs; the inline scoring of the test set is
        # not training time, so the budget is --max-train-seconds, not wall time.
        return [sys.executable, str(MAIN), "-m", mode.cli_mode, "-c", "1", *common,
                "--max-train-seconds", f"{budget!r}", "--max-seconds", "0",
                "-e", str(args.local_eval_every)]
    common += ["--max-seconds", f"{budget!r}"]
    if target_accuracy:
        common += ["--target-accuracy", f"{target_accuracy:g}"]
    argv = [sys.executable, "-m", "esync.launch", "-m", mode.cli_mode]
    if mode.dcasgd:
        argv += ["-dcasgd", str(mode.dcasgd)]
    if row.devices:
        return argv + subset_argv(args, row, setting, common)
    machines = getattr(args, "machines", None)     # real devices: the backend places them
    placement = machines.launcher if machines else [
        "--workers", str(args.workers), "--slowdown", ",".join(f"{f:g}" for f in args.slowdowns)]
    argv += [*placement, *common, "-e", CLUSTER_EVAL, *row.extra]
    if row.split:
        argv += ["-s", str(row.split)]
    argv += list(getattr(args, "emulation_argv", []))
    return argv + [*setting.argv, "--quiet"]


def momentum_argv(args, row: Row) -> list[str]:
    """main.py's --momentum (and --nesterov under --tune-nesterov) of a row's pair; none for
    plain SGD, so such a run's command is the original's."""
    if not row.momentum:
        return []
    return ["--momentum", f"{row.momentum:g}", *(["--nesterov"] if getattr(
        args, "tune_nesterov", False) else [])]


def subset_argv(args, row: Row, setting: Setting, common: list[str]) -> list[str]:
    """The launcher's flags of a row on some devices alone: their factors, and under CPU caps
    the whole cluster's share for a x1 device (``--cpu-share``) with ``--emulation cpu-cap``
    (under ``auto`` the launcher caps nothing when no device is slower than x1, and the fast
    devices would compute on whole cores), so each device computes as fast as it does in the
    cluster; a per-host --bandwidth list keeps those hosts' rates, and each device is a host of
    its own (--hosts is the whole cluster's layout)."""
    factors = [args.slowdowns[i] for i in row.devices]
    emulation = list(getattr(args, "emulation_argv", []))
    share = cluster_share(args)
    if share is not None:
        emulation = capped(emulation, share)
    argv = ["--workers", str(len(factors)), "--slowdown", ",".join(f"{f:g}" for f in factors),
            *common, "-e", CLUSTER_EVAL, *row.extra, *emulation]
    shown = list(setting.argv)
    if "--hosts" in shown:
        at = shown.index("--hosts")
        del shown[at:at + 2]
    if "--bandwidth" in shown:
        at = shown.index("--bandwidth") + 1
        rates = shown[at].split(",")
        if len(rates) == args.workers:
            shown[at] = ",".join(rates[i] for i in row.devices)
    return argv + [*shown, "--quiet"]


def capped(emulation_argv: list[str], share: float) -> list[str]:
    """The launcher's emulation flags with every device capped: ``--emulation cpu-cap`` (under
    ``auto`` it caps nothing where no device is slower than x1) and ``--cpu-share`` where the
    flags name none."""
    found = list(emulation_argv)
    found[found.index("--emulation") + 1] = "cpu-cap"
    if "--cpu-share" not in found:
        found += ["--cpu-share", f"{share:g}"]
    return found


def cluster_share(args) -> float | None:
    """The cores a x1 device of the whole cluster computes with under CPU caps (None when
    the runs sleep instead): what the fast-devices rows pass as --cpu-share."""
    if not getattr(args, "launcher_emulation", False) or args.emulation == "sleep":
        return None
    from esync.emulation.shaping import x1_share
    return x1_share(args)


def child_env(job_or_mode) -> dict:
    """The benchmark owns its clusters: no inherited ps-lite settings; one thread for local
    (and whatever the job adds: the CPU cap's one-compute-thread variables)."""
    name = job_or_mode if isinstance(job_or_mode, str) else job_or_mode.row.mode
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    env.update(python_env())
    if not modes.get(name).cluster:
        env.update(OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1")
    if not isinstance(job_or_mode, str):
        env.update(job_or_mode.env)
    return env


def estimate(jobs: list[Job]) -> dict:
    """Seconds the runs should take: each its budget (SSGD's cap: at most) plus the overhead
    per run measured in a full benchmark (``OVERHEAD_S``), plus ``FIXED_OVERHEAD_S``."""
    training = sum(j.budget for j in jobs)
    overhead = sum(run_overhead(j) for j in jobs)
    return {"training_s": training, "overhead_s": overhead,
            "total_s": training + overhead + FIXED_OVERHEAD_S}


def run_overhead(job: Job) -> float:
    if job.standalone:
        fixed, share = STANDALONE_OVERHEAD_S
        return fixed + share * job.budget
    if job.tuning:
        return OVERHEAD_S["tune"]
    return OVERHEAD_S["netns" if "netns" in job.setting.argv else "loopback"]


def display_argv(argv: list[str]) -> list[str]:
    """``python`` for the interpreter, ``main.py`` relative: readable, still runnable."""
    shown = ["python" if a == sys.executable else a for a in argv]
    return ["main.py" if a == str(MAIN) else a for a in shown]
