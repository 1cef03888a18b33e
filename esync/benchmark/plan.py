"""Which runs the benchmark makes: rows (a mode, its variant, a data split), network settings,
tuning runs and full runs, each with its command line, log folder and environment."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from esync.common import modes

REPO = Path(__file__).resolve().parents[2]
MAIN = REPO / "main.py"
# Checkpoint (and so evaluation) interval in rounds: a sync or ESync round waits for the slowest
# device, an async "round" is one iteration of rank 0 (a fast device), so async checkpoints
# every 40 iterations to score about as often in time (~1.5 s on the default cluster) and keep
# the evaluator's work, which shares the CPU with the workers, alike across modes.
EVAL_ROUNDS = {"esync": 10, "sync": 10, "async": 40, "dcasgd": 40}
RUNS_DIR = "runs"             # captured output of every launcher / main.py subprocess
TUNE_DIR = "tune"


@dataclass(frozen=True)
class Row:
    """One line of the report: a registry mode, its variant and a data split."""
    name: str                 # esync-fednova-niid, sync, local, ...
    label: str                # ESync (fednova) (non-i.i.d.)
    mode: str                 # registry mode name
    split: int                # -s
    extra: tuple[str, ...] = ()   # launcher flags of the variant (--aggregation, --policy ...)
    group: str = ""           # tuning group: rows of one group share a learning rate

    @property
    def lr_flag(self) -> str:
        """ESync tunes its local steps' rate; every other mode its SGD rate."""
        return "-ll" if self.mode == "esync" else "-l"


@dataclass(frozen=True)
class Setting:
    """A network setting: loopback, or namespaces with shaped links."""
    name: str                 # loopback | netns
    label: str
    argv: tuple[str, ...] = ()


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
    returncode: int | None = None
    seconds: float = 0.0
    error: str | None = None
    summary: dict | None = field(default=None, repr=False)

    @property
    def tuning(self) -> bool:
        return self.rep == 0

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def tag(self) -> str:
        if self.tuning:
            return f"tune {self.row.group} lr {self.lr:g}"
        return f"rep {self.rep} {self.setting.name} {self.row.name}"

    @property
    def ok(self) -> bool:
        return self.error is None and self.summary is not None


def policies(args) -> list[str]:
    return ["dynamic", "planned"] if args.policy == "both" else [args.policy]


def rows(args) -> list[Row]:
    """Every row in report order: i.i.d. rows, then by-class rows of the cluster modes; each
    (mode, variant, split) is a tuning group of its own."""
    found = []
    for split_value in args.splits:
        split = modes.split(split_value)
        for name in args.mode_list:
            mode = modes.get(name)
            if split_value and not mode.cluster:
                continue
            for base, label, extra in _variants(args, mode):
                # A row's best rate on by-class data is not its i.i.d. one: its own group.
                found.append(Row(name=base + split.suffix,
                                 label=label + (f" ({split.label})" if split.label else ""),
                                 mode=name, split=split_value, extra=tuple(extra),
                                 group=base + split.suffix))
    return found


def _variants(args, mode: modes.Mode) -> list[tuple[str, str, list[str]]]:
    """(row base name, label, extra launcher flags) of one mode."""
    if mode.name != "esync":
        return [(mode.name, mode.label, [])]
    variants = []
    both = args.policy == "both"
    for agg in args.aggregation_list:
        flags = agg.argv() if args.aggregation_flags else []
        for policy in policies(args):
            name = f"esync-{agg.slug}" + (f"-{policy}" if both else "")
            label = f"{mode.label} ({agg.label}" + (f", {policy} policy)" if both else ")")
            variants.append((name, label, flags + ["--policy", policy]))
    return variants


def settings(args, rates: dict | None) -> list[Setting]:
    """The network settings to run, in report order; ``rates`` from ``shaping`` for netns."""
    found = []
    for net in args.net_list:
        if net == "loopback":
            found.append(Setting("loopback", "loopback (free networking)"))
            continue
        worker_rates, server_rate = rates["worker"], rates["server"]
        argv = ["--net", "netns", "--bandwidth", ",".join(worker_rates),
                "--server-bandwidth", server_rate]
        if args.hosts:
            argv += ["--hosts", args.hosts]
        found.append(Setting("netns", f"shaped links ({','.join(worker_rates)} per worker "
                                      f"host, {server_rate} at the server)", tuple(argv)))
    return found


def tuning_jobs(args, out: Path, all_rows: list[Row], setting: Setting) -> list[Job]:
    """A short run of every tuning group with each grid value, in the first setting."""
    if args.lr_grid is None:
        return []
    jobs, seen = [], set()
    for row in all_rows:
        if row.group in seen:
            continue
        seen.add(row.group)
        for lr in args.lr_grid:
            root = out / TUNE_DIR / row.group / f"lr{lr:g}"
            jobs.append(_job(args, row, setting, 0, lr, root, args.tune_budget,
                             out / RUNS_DIR / f"tune-{row.group}-lr{lr:g}.log"))
    return jobs


def full_jobs(args, out: Path, all_rows: list[Row], all_settings: list[Setting],
              lrs: dict[str, float]) -> list[Job]:
    """Per repeat: every row in every setting (standalone and by-class rows in the first only)."""
    jobs = []
    for rep in range(1, args.repeats + 1):
        for i, setting in enumerate(all_settings):
            for row in all_rows:
                if i and (not modes.get(row.mode).cluster or row.split):
                    continue
                root = out / setting.name / f"rep{rep}" / row.name
                jobs.append(_job(args, row, setting, rep, lrs[row.group], root, args.budget,
                                 out / RUNS_DIR / f"{setting.name}-rep{rep}-{row.name}.log"))
    return jobs


def default_lr(args, row: Row) -> float:
    return args.local_lr if row.lr_flag == "-ll" else args.learning_rate


def _job(args, row, setting, rep, lr, root, budget, log) -> Job:
    mode = modes.get(row.mode)
    folder = root / args.network / modes.folder_name(mode.cli_mode, mode.dcasgd, row.split)
    return Job(row=row, setting=setting, rep=rep, lr=lr, root=root, folder=folder,
               argv=job_argv(args, row, setting, lr, root, budget), log=log, budget=budget)


def job_argv(args, row: Row, setting: Setting, lr: float, root: Path,
             budget: float) -> list[str]:
    mode = modes.get(row.mode)
    common = ["-n", args.network, "-b", str(args.batch_size), row.lr_flag, f"{lr!r}",
              "-ld", str(root), "--seed", str(args.seed), "-dd", str(args.data_dir)]
    if not mode.cluster:
        # The same training time as the cluster runs; the inline scoring of the test set is
        # not training time, so the budget is --max-train-seconds, not wall time.
        return [sys.executable, str(MAIN), "-m", mode.cli_mode, "-c", "1", *common,
                "--max-train-seconds", f"{budget!r}", "--max-seconds", "0",
                "-e", str(args.local_eval_every)]
    common += ["--max-seconds", f"{budget!r}"]
    argv = [sys.executable, "-m", "esync.launch", "-m", mode.cli_mode]
    if mode.dcasgd:
        argv += ["-dcasgd", str(mode.dcasgd)]
    argv += ["--workers", str(args.workers),
             "--slowdown", ",".join(f"{f:g}" for f in args.slowdowns), *common,
             "-e", str(EVAL_ROUNDS.get(row.mode, 10)), *row.extra]
    if row.split:
        argv += ["-s", str(row.split)]
    return argv + [*setting.argv, "--quiet"]


def child_env(job_or_mode) -> dict:
    """The benchmark owns its clusters: no inherited ps-lite settings; one thread for local."""
    name = job_or_mode if isinstance(job_or_mode, str) else job_or_mode.row.mode
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    env["PYTHONUNBUFFERED"] = "1"
    if not modes.get(name).cluster:
        env.update(OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1")
    return env


def display_argv(argv: list[str]) -> list[str]:
    """``python`` for the interpreter, ``main.py`` relative: readable, still runnable."""
    shown = ["python" if a == sys.executable else a for a in argv]
    return ["main.py" if a == str(MAIN) else a for a in shown]
