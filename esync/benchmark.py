"""Run every mode on the same emulated cluster and write one report folder.

    esync-benchmark                                     # 4 workers x1,x1,x4,x8, lenet, 90 s a mode
    esync-benchmark --budget 20 --modes esync,sync,local --out reports/try
    python scripts/benchmark.py --niid --repeats 3      # also non-i.i.d.; mean ± std over 3 runs

Each cluster mode (esync, sync, async, dcasgd) runs through the launcher as a subprocess
(``python -m esync.launch -m MODE ... --max-seconds BUDGET -ld OUT/rep<i> --quiet``), one after the
other, with the same training-time budget; ``local`` runs ``main.py -m local`` on one device at
full speed (``OMP_NUM_THREADS=1``). Repeat ``i`` logs into ``OUT/rep<i>/``; with ``--policy both``
ESync's "planned" policy runs too, into ``OUT/rep<i>-planned/`` (the launcher's mode folder has no
policy in its name), and is reported as its own row ``esync-planned``.

Afterwards every mode folder is summarised (``esync.analysis.summary``), the comparison figures
and the speedup table are drawn (``esync.analysis.drawer`` / ``table``) into the report folder,
and ``OUT/report.md`` gives per mode: time to the target accuracy and speedup over SSGD, final
accuracy next to standalone SGD's, throughput (also as a fraction of the physical limit: the sum
over workers of standalone throughput / slow-down), computing-time ratio per device, traffic
(bytes pushed + pulled per second, as counted) and state-server requests per worker and round.
``OUT/benchmark.json`` holds the same numbers for programs. A mode that fails is reported (its
name and the tail of its output) and the others still run; the exit code is then 1.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import config
from esync.cli import bounded_number
from esync.procs import die_with_parent, kill_group

REPO = Path(__file__).resolve().parents[1]
MAIN = REPO / "main.py"
PROG = "esync-benchmark"

MODES = ("esync", "sync", "async", "dcasgd", "local")
NIID_MODES = ("esync", "sync", "async", "dcasgd")
POLICIES = ("dynamic", "planned", "both")
PLANNED = "-planned"          # row name and log-root suffix of ESync's planned policy
FIGURES_DIR = "figures"
RUNS_DIR = "runs"             # captured output of every launcher / main.py subprocess
TAIL_LINES = 25


class UsageError(Exception):
    """A bad option; reported as one ``error:`` line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


# ----------------------------------------------------------------------------- options

_positive_int = bounded_number(int, low=0, strict=True, must="a positive integer")
_non_negative_int = bounded_number(int, low=0, must="an integer >= 0")
_positive_float = bounded_number(float, low=0, strict=True, must="a positive number")
_target = bounded_number(float, low=0, strict=True, high=1, must="a number in (0, 1]")


def parse_modes(text: str) -> list[str]:
    """``"esync,sync"`` -> ``["esync", "sync"]`` in the paper's order; bad names are named."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError("argument --modes: give at least one of " + ", ".join(MODES))
    unknown = [m for m in items if m not in MODES]
    if unknown:
        raise UsageError(f"argument --modes: {', '.join(map(repr, unknown))} is not a mode; "
                         f"choose from {', '.join(MODES)} (comma-separated)")
    return [m for m in MODES if m in items]


def parse_slowdowns(text: str, workers: int) -> list[float]:
    """One factor >= 1 per worker (or one for all), as the launcher takes them."""
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        raise UsageError(f"argument --slowdown: {text!r} is not a comma-separated list of "
                         "numbers") from None
    if len(values) == 1:
        values *= workers
    if len(values) != workers:
        raise UsageError(f"argument --slowdown: {len(values)} factors for {workers} workers "
                         "(give one per worker, or one for all)")
    if any(not (v >= 1 and math.isfinite(v)) for v in values):
        raise UsageError(f"argument --slowdown: factors must be numbers >= 1, got {text!r}")
    return values


def _cluster_defaults() -> dict:
    from esync.launch import CLUSTER_DEFAULTS
    return CLUSTER_DEFAULTS


def build_parser() -> argparse.ArgumentParser:
    defaults = _cluster_defaults()
    from esync.analysis.summary import HelpFormatter
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                     formatter_class=HelpFormatter)
    c = parser.add_argument_group("cluster (the same for every mode)")
    c.add_argument("--workers", type=_positive_int, default=4, help="number of workers")
    c.add_argument("--slowdown", default="1,1,4,8",
                   help="slow-down factor per worker (comma-separated, or one for all)")
    c.add_argument("-n", "--network", default=defaults["network"], help="network")
    c.add_argument("-b", "--batch-size", type=_positive_int, default=config.batch_size,
                   help="samples per iteration on each device")
    c.add_argument("-l", "--learning-rate", type=_positive_float,
                   default=defaults["learning_rate"],
                   help="SGD learning rate of sync, async, dcasgd and local")
    c.add_argument("-ll", "--local-lr", type=_positive_float, default=defaults["local_lr"],
                   help="learning rate of ESync's local iterations")
    c.add_argument("-dd", "--data-dir", default=config.data_dir,
                   help="folder holding fashion-mnist/")
    c.add_argument("--seed", type=_non_negative_int, default=config.seed,
                   help="data partition, shuffling and initial weights")
    r = parser.add_argument_group("what to run")
    r.add_argument("--budget", type=_positive_float, default=90.0,
                   help="training seconds per mode (the launcher's --max-seconds)")
    r.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated subset of " + ", ".join(MODES))
    r.add_argument("--niid", action="store_true",
                   help="also run the non-i.i.d. variants (-s 1) of esync, sync, async, dcasgd")
    r.add_argument("--repeats", type=_positive_int, default=1,
                   help="run everything R times, repeat i into OUT/rep<i>/ (mean ± std)")
    r.add_argument("--policy", choices=POLICIES, default="both",
                   help="ESync's state-server policy; both: dynamic as 'esync', planned as "
                        "'esync-planned' (logs in OUT/rep<i>-planned/)")
    r.add_argument("--target", type=_target, default=0.8,
                   help="test accuracy whose time to reach gives the speedup")
    r.add_argument("--local-eval-every", type=_positive_int, default=100,
                   help="standalone run: evaluate every this many iterations (main.py -e)")
    r.add_argument("--job-timeout", type=_positive_float, default=None,
                   help="stop a mode that runs longer than this many seconds "
                        "(default: 2 x budget + 300)")
    o = parser.add_argument_group("output")
    o.add_argument("--out", default=None,
                   help="report folder (default: reports/benchmark-<timestamp>/)")
    o.add_argument("--overwrite", action="store_true",
                   help="reuse a non-empty --out folder: each run's mode folder is deleted "
                        "before the run, the report files are replaced")
    return parser


def parse_args(argv) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    args.mode_list = parse_modes(args.modes)
    args.slowdowns = parse_slowdowns(args.slowdown, args.workers)
    from esync.models import NETWORKS
    if args.network not in NETWORKS:
        raise UsageError(f"argument -n/--network: {args.network!r} is not a network; choose "
                         f"one of {', '.join(NETWORKS)}")
    from esync.data import FASHION_FILES, FASHION_SUBDIR
    folder = Path(args.data_dir) / FASHION_SUBDIR
    missing = [f for pair in FASHION_FILES.values() for f in pair if not (folder / f).exists()]
    if missing:
        raise UsageError(f"data folder {folder} lacks {', '.join(missing)}: run "
                         f"`python scripts/prepare_data.py --data-dir {args.data_dir}`")
    if args.out is None:
        args.out = str(Path("reports") / f"benchmark-{datetime.now():%Y%m%d-%H%M%S}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"argument --out: {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise UsageError(f"argument --out: {out} already holds files (an earlier benchmark?); "
                         "choose another --out or pass --overwrite")
    if args.job_timeout is None:
        args.job_timeout = 2 * args.budget + 300
    return args


def canonical_command(args) -> str:
    """The command with every option spelled out: reruns the same benchmark."""
    argv = [PROG, "--workers", str(args.workers), "--slowdown", args.slowdown,
            "-n", args.network, "-b", str(args.batch_size), "-l", repr(args.learning_rate),
            "-ll", repr(args.local_lr), "--seed", str(args.seed), "--budget", f"{args.budget:g}",
            "--modes", ",".join(args.mode_list), "--repeats", str(args.repeats),
            "--policy", args.policy, "--target", f"{args.target:g}",
            "--local-eval-every", str(args.local_eval_every), "--out", str(args.out)]
    if args.niid:
        argv.append("--niid")
    if Path(args.data_dir).resolve() != Path(config.data_dir).resolve():
        argv += ["-dd", str(args.data_dir)]
    return shlex.join(argv)


# ----------------------------------------------------------------------------- the runs

@dataclass
class Job:
    name: str            # row name: esync, esync-planned, sync-niid, local, ...
    mode: str            # esync, sync, async, dcasgd or local
    niid: bool
    policy: str | None   # ESync only
    rep: int             # 1-based
    root: Path           # log root (-ld)
    folder: Path         # the mode folder the run writes
    argv: list[str]
    log: Path            # captured stdout + stderr of the subprocess
    returncode: int | None = None
    seconds: float = 0.0
    error: str | None = None
    summary: dict | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None and self.summary is not None


def mode_dir_name(mode: str, niid: bool) -> str:
    from esync.algorithms import mode_dir_name as name
    dcasgd = mode == "dcasgd"
    return name("async" if dcasgd else mode, int(dcasgd), int(niid))


def plan(args, out: Path) -> list[Job]:
    """Every run, in order: per repeat the modes in the paper's order, then non-i.i.d. ones."""
    variants = []
    for niid in (False, True) if args.niid else (False,):
        for mode in args.mode_list:
            if niid and mode not in NIID_MODES:
                continue
            if mode == "esync":
                policies = ["dynamic", "planned"] if args.policy == "both" else [args.policy]
            else:
                policies = [None]
            for policy in policies:
                variants.append((mode, niid, policy))
    jobs = []
    for rep in range(1, args.repeats + 1):
        for mode, niid, policy in variants:
            planned_row = args.policy == "both" and policy == "planned"
            root = out / (f"rep{rep}" + (PLANNED if planned_row else ""))
            folder_name = mode_dir_name(mode, niid)
            name = folder_name if not planned_row else (
                mode + PLANNED + ("-niid" if niid else ""))
            folder = root / args.network / folder_name
            jobs.append(Job(name=name, mode=mode, niid=niid, policy=policy, rep=rep, root=root,
                            folder=folder, argv=job_argv(args, mode, niid, policy, root),
                            log=out / RUNS_DIR / f"rep{rep}-{name}.log"))
    return jobs


def job_argv(args, mode: str, niid: bool, policy: str | None, root: Path) -> list[str]:
    common = ["-n", args.network, "-b", str(args.batch_size), "-l", f"{args.learning_rate!r}",
              "--max-seconds", f"{args.budget!r}", "-ld", str(root), "--seed", str(args.seed),
              "-dd", str(args.data_dir)]
    if mode == "local":
        return [sys.executable, str(MAIN), "-m", "local", "-c", "1", *common,
                "-e", str(args.local_eval_every)]
    argv = [sys.executable, "-m", "esync.launch", "-m", "async" if mode == "dcasgd" else mode]
    if mode == "dcasgd":
        argv += ["-dcasgd", "1"]
    argv += ["--workers", str(args.workers), "--slowdown", ",".join(f"{f:g}" for f in
                                                                   args.slowdowns), *common]
    if mode == "esync":
        argv += ["-ll", f"{args.local_lr!r}", "--policy", policy]
    if niid:
        argv += ["-s", "1"]
    return argv + ["--quiet"]


def child_env(mode: str) -> dict:
    """The benchmark owns its clusters: no inherited ps-lite settings; one thread for local."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    env["PYTHONUNBUFFERED"] = "1"
    if mode == "local":
        env.update(OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1")
    return env


class Progress:
    """Which run, its elapsed time: a tqdm bar on a terminal, a plain line every 15 s otherwise."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream = total, stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self.bar = None
        self.last_line = 0.0
        self.index = 0
        if self.tty:
            from tqdm import tqdm
            try:
                size = os.get_terminal_size(self.stream.fileno())
            except (OSError, ValueError, AttributeError):
                size = os.terminal_size((0, 0))
            # A pseudo-terminal that reports a 0x0 size would get no bar at all from tqdm.
            sized = size.columns > 0 and size.lines > 0
            self.bar = tqdm(total=total, unit="run", file=self.stream, dynamic_ncols=sized,
                            ncols=None if sized else 100, nrows=None if sized else 24,
                            bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} runs{postfix}")

    def _line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(f"{PROG}: {text}", file=self.stream)
        else:
            print(f"{PROG}: {text}", file=self.stream, flush=True)

    def _tag(self, job: Job) -> str:
        return f"[{self.index}/{self.total}] rep {job.rep} {job.name}"

    def begin(self, job: Job) -> None:
        self.index += 1
        self.last_line = time.monotonic()
        if self.bar is not None:
            self.bar.set_description_str(self._tag(job))
            self.bar.set_postfix_str("starting")
        else:
            self._line(f"{self._tag(job)}: started")

    def tick(self, job: Job, elapsed: float) -> None:
        now = time.monotonic()
        total = now - self.start
        if self.bar is not None:
            self.bar.set_postfix_str(f"{elapsed:.0f}s in this run, {total:.0f}s in all")
        elif now - self.last_line >= 15:
            self.last_line = now
            self._line(f"{self._tag(job)}: {elapsed:.0f}s elapsed ({total:.0f}s in all)")

    def end(self, job: Job) -> None:
        verdict = ("done" if job.error is None else f"FAILED: {job.error}")
        self._line(f"{self._tag(job)}: {verdict} after {job.seconds:.0f}s")
        if self.bar is not None:
            self.bar.update(1)

    def note(self, text: str) -> None:
        self._line(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM (the launcher then stops its cluster), SIGKILL to the group after `grace` s."""
    kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_group(proc, signal.SIGKILL)
        proc.wait()


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def run_job(job: Job, progress: Progress, timeout: float) -> None:
    """Run one mode to its end (or timeout); sets returncode, seconds and error."""
    job.log.parent.mkdir(parents=True, exist_ok=True)
    if job.folder.exists():
        # Only with --overwrite (checked in parse_args): replace this run entirely, so that no
        # earlier record (e.g. an evaluations.jsonl line) can mix into the new one.
        shutil.rmtree(job.folder)
    start = time.monotonic()
    with open(job.log, "wb") as out:
        out.write(f"$ {shlex.join(job.argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(job.argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(REPO), env=child_env(job.mode),
                                start_new_session=True, preexec_fn=die_with_parent)
    try:
        while proc.poll() is None:
            elapsed = time.monotonic() - start
            if elapsed > timeout:
                stop(proc)
                job.error = f"no end after {timeout:.0f}s; stopped"
                break
            progress.tick(job, elapsed)
            time.sleep(0.5)
    except BaseException:
        stop(proc, grace=15)
        raise
    job.seconds = time.monotonic() - start
    job.returncode = proc.returncode
    if job.error is None and proc.returncode != 0:
        code = proc.returncode
        job.error = (f"exit code {code}" if code >= 0
                     else f"killed by signal {signal.Signals(-code).name}")


def summarise(job: Job) -> None:
    """Summarise the job's mode folder (fresh, whatever the launcher wrote)."""
    from esync.analysis.summary import LogError, load_summary, write_summary
    try:
        job.summary = load_summary(write_summary(job.folder))
    except (LogError, OSError) as exc:
        job.error = f"no summary: {exc}"
    except Exception as exc:      # a bug in the analysis must not cost the other modes' report
        job.error = f"no summary: {type(exc).__name__}: {exc}"


# ----------------------------------------------------------------------------- the numbers

def mean_std(values) -> tuple[float | None, float | None, int]:
    from esync.analysis.table import mean_std as ms
    return ms(values)


def physical_limit(local_summary: dict | None, slowdowns: list[float]) -> dict:
    """Standalone throughput of one device and the cluster's limit: sum of it / slow-down."""
    from esync.analysis.table import cluster_totals
    if local_summary is None:
        return {"standalone_throughput": None, "cluster_limit": None}
    tp = cluster_totals(local_summary).get("throughput")
    return {"standalone_throughput": tp,
            "cluster_limit": None if tp is None else sum(tp / f for f in slowdowns)}


def run_metrics(summary: dict, limit: dict, *, standalone: bool) -> dict:
    """The report's figures for one mode in one repeat, straight from its summary."""
    from esync.analysis.summary import device_entries
    from esync.analysis.table import accuracy_series, cluster_totals, final_accuracy, \
        time_to_accuracy
    t = cluster_totals(summary)
    bound = limit["standalone_throughput"] if standalone else limit["cluster_limit"]
    throughput = t.get("throughput")
    devices = {}
    for host, device, entry in device_entries(summary):
        devices[f"{host}/{device}"] = {
            "slowdown": entry.get("slowdown"), "throughput": entry.get("throughput"),
            "computing_time_ratio": entry.get("computing_time_ratio"),
            "rounds": len(entry.get("num_samples_list") or [])}
    series = accuracy_series(summary)
    return {
        "throughput": throughput,
        "limit": bound,
        "throughput_fraction": (throughput / bound if throughput is not None and bound
                                else None),
        "traffic_bytes_per_s": t.get("traffic_bytes_per_s"),
        "bytes_pushed": t.get("bytes_pushed"), "bytes_pulled": t.get("bytes_pulled"),
        "state_requests_per_round": t.get("state_requests_per_round"),
        "mean_computing_time_ratio": t.get("mean_computing_time_ratio"),
        "wall_time": t.get("wall_time"), "samples": t.get("samples"),
        "final_accuracy": final_accuracy(summary),
        "accuracy_source": None if series is None else series[2],
        "devices": devices,
    }


def analyse(args, jobs: list[Job], out: Path, progress: Progress) -> dict:
    """Summaries -> figures, speedup table and the per-mode numbers of the report."""
    for job in jobs:
        if job.error is None:
            summarise(job)
            if job.error is not None:
                progress.note(f"rep {job.rep} {job.name}: {job.error}")
    runs = [{} for _ in range(args.repeats)]
    for job in jobs:
        if job.ok:
            runs[job.rep - 1][job.name] = job.summary
    names = []
    for job in jobs:
        if job.name not in names:
            names.append(job.name)

    limits = [physical_limit(run.get("local"), args.slowdowns) for run in runs]
    per_rep = {name: [run_metrics(run[name], limits[i], standalone=name == "local")
                      if name in run else None for i, run in enumerate(runs)]
               for name in names}

    written, rows, problems = [], [], []
    if any(runs):
        from esync.analysis.table import speedup_table, write_table
        try:
            rows = speedup_table(runs, target=args.target)
            written += write_table(rows, out, network=args.network, target=args.target)
        except Exception as exc:
            problems.append(f"speedup table: {type(exc).__name__}: {exc}")
        try:
            written += draw(args, runs, out / FIGURES_DIR, progress)
        except Exception as exc:
            problems.append(f"figures: {type(exc).__name__}: {exc}")
    for problem in problems:
        progress.note(f"FAILED: {problem}")
    return {"runs": runs, "names": names, "limits": limits, "per_rep": per_rep,
            "table": rows, "written": written, "problems": problems}


def draw(args, runs: list[dict], folder: Path, progress: Progress) -> list[Path]:
    """The drawer's figures from the first repeat that has any mode, plus the policy figure."""
    import matplotlib
    matplotlib.use("Agg")
    from esync.analysis import drawer
    from esync.analysis.summary import split_mode
    first = next(run for run in runs if run)
    known = {m: s for m, s in first.items() if split_mode(m)[0] in MODES}
    written = []
    notes = []
    if known:
        written += drawer.draw_all(known, folder, network=args.network, notify=notes.append)
    if any(PLANNED in m for m in first):
        written += draw_policies(first, folder, network=args.network)
    for note in notes:
        if args.niid or "niid" not in note:       # no non-i.i.d. runs asked for: no news
            progress.note(f"figures: {note}")
    return written


def draw_policies(summaries: dict, folder: Path, *, network: str) -> list[Path]:
    """ESync's two state-server policies side by side: accuracy over time, requests per round."""
    from matplotlib.figure import Figure

    from esync.analysis.table import accuracy_series, cluster_totals
    names = [m for m in ("esync", "esync" + PLANNED, "sync", "esync-niid",
                         "esync" + PLANNED + "-niid", "sync-niid") if m in summaries]
    colors = {"esync": "m", "esync" + PLANNED: "c", "sync": "orange"}
    fig = Figure(figsize=(11, 4.8))
    acc_ax, req_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    drawn = False
    for name in names:
        series = accuracy_series(summaries[name])
        if series is None:
            continue
        drawn = True
        pairs = sorted(zip(series[0], series[1]))
        base = name.removesuffix("-niid")
        acc_ax.plot([t for t, _ in pairs], [a for _, a in pairs], color=colors.get(base),
                    linestyle="--" if name.endswith("-niid") else "-", marker=".",
                    label=policy_label(name))
    if drawn:
        acc_ax.legend(fontsize="small")
    acc_ax.set_xlabel("Time (s)")
    acc_ax.set_ylabel("Test accuracy")
    acc_ax.set_ylim(0, 1)
    acc_ax.grid(alpha=0.3)
    acc_ax.set_title("Test accuracy")
    esyncs = [m for m in names if m.startswith("esync")]
    values = [cluster_totals(summaries[m]).get("state_requests_per_round") for m in esyncs]
    bars = req_ax.bar(range(len(esyncs)), [math.nan if v is None else v for v in values],
                      color=[colors.get(m.removesuffix("-niid"), "0.5") for m in esyncs])
    req_ax.bar_label(bars, fmt="%.2f")
    req_ax.set_xticks(range(len(esyncs)), [policy_label(m) for m in esyncs], rotation=15,
                      ha="right")
    req_ax.set_ylabel("State-server requests per worker and round")
    req_ax.set_title("Coordination cost")
    fig.suptitle(f"ESync's state-server policies — {network}")
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{network}-esync-policies.png", folder / f"{network}-esync-policies.svg"]
    for path in paths:
        fig.savefig(path, dpi=120)
    return paths


def policy_label(name: str) -> str:
    from esync.analysis.table import mode_label
    niid = name.endswith("-niid")
    base = name.removesuffix("-niid")
    if base.endswith(PLANNED):
        label = mode_label(base.removesuffix(PLANNED)) + " (planned policy)"
        return label + (" (non-i.i.d.)" if niid else "")
    return mode_label(name)


# ----------------------------------------------------------------------------- the report

def _num(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _cell(values, spec: str, scale: float = 1.0) -> str:
    """Mean (± sample std over repeats when there are several) of the values that exist."""
    values = [v * scale for v in values if v is not None]
    mean, std, n = mean_std(values)
    if mean is None:
        return "n/a"
    return format(mean, spec) + (f" ± {format(std, spec)}" if n > 1 else "")


def _row_label(name: str) -> str:
    return f"{policy_label(name)} (`{name}`)"


def render_report(args, jobs: list[Job], result: dict, *, command: str, started: datetime,
                  seconds: float) -> str:
    from esync.analysis.table import time_cell as table_time_cell
    out = Path(args.out)
    names, per_rep, rows = result["names"], result["per_rep"], result["table"]
    table = {row["mode"]: row for row in rows}
    split = "i.i.d. (`-s 0`)" + (" and non-i.i.d. (`-s 1`)" if args.niid else "")
    policy = {"both": "both: `esync` (dynamic, the original's) and `esync-planned` (planned, "
                      "logs in `rep<i>-planned/`)",
              "dynamic": "dynamic (the original's)", "planned": "planned"}[args.policy]
    slow = ", ".join(f"×{f:g}" for f in args.slowdowns)
    L = [f"# esync benchmark — {args.network}, {args.workers} workers ({slow})", ""]
    L += ["**Machine noise.** Every figure below comes from "
          + ("one run" if args.repeats == 1 else f"{args.repeats} runs")
          + f" on this machine ({socket.gethostname()}, {os.cpu_count()} CPU cores, shared with "
          "whatever else ran at the time). Absolute seconds and samples/s move from run to run; "
          "the meaningful quantities are the ratios between modes measured in the same run "
          "(speedup over SSGD, throughput as a fraction of the physical limit, computing-time "
          "ratio).", ""]
    L += ["## Cluster", "",
          f"- {args.workers} emulated devices on this machine's CPU, one worker process each "
          f"(`OMP_NUM_THREADS=1`), slow-down factors {slow} (a worker ×F waits (F−1)·t after "
          "each iteration of t seconds; the wait counts as computing time)",
          f"- network `{args.network}`, batch {args.batch_size} per device, data {split}, "
          f"seed {args.seed}",
          f"- the same training-time budget for every mode: {args.budget:g} s "
          f"(`--max-seconds`); evaluation by the evaluator process, off the workers' path",
          f"- learning rates: SGD `-l {args.learning_rate:g}` (sync, async, dcasgd, local), "
          f"ESync local `-ll {args.local_lr:g}`; ESync state-server policy: {policy}",
          f"- standalone SGD (`local`): `main.py -m local` on one device at full speed "
          f"(slow-down 1, `OMP_NUM_THREADS=1`), evaluated every {args.local_eval_every} "
          "iterations (evaluation time is not training time)",
          f"- target test accuracy {args.target:.2f}; {args.repeats} repeat(s)"
          + ("" if args.repeats == 1 else " (cells: mean ± sample std over repeats)"),
          f"- started {started:%Y-%m-%d %H:%M:%S}, took {seconds / 60:.1f} min; "
          f"Python {platform.python_version()}, {platform.platform()}", ""]
    L += ["## Command", "", "```", command, "```", "",
          "Every option spelled out (runs the same benchmark again; change `--out`):", "",
          "```", canonical_command(args), "```", ""]

    L += ["## Results", ""]
    limits = [lim["cluster_limit"] for lim in result["limits"]]
    standalone_tp = [lim["standalone_throughput"] for lim in result["limits"]]
    if any(v is not None for v in limits):
        L += [f"Physical limit of the cluster: standalone throughput of one device "
              f"({_cell(standalone_tp, '.1f')} samples/s, from the `local` run) × "
              f"Σ 1/F over the workers ({sum(1 / f for f in args.slowdowns):.3f}) = "
              f"**{_cell(limits, '.1f')} samples/s**.", ""]
    else:
        L += ["Physical limit: n/a (no successful `local` run to measure standalone "
              "throughput; add `local` to `--modes`).", ""]
    L += [f"| Mode | Time to {args.target:.2f} (s) | Speedup vs SSGD | Final accuracy "
          "| Standalone SGD accuracy | Throughput (samples/s) | Fraction of physical limit "
          "| Traffic (MB/s pushed+pulled) | State-server requests per worker-round |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        metrics = [m for m in per_rep[name] if m is not None]
        if not metrics:
            L.append(f"| {_row_label(name)} | failed | | | | | | | |")
            continue
        row = table.get(name)
        if row is None:               # the table could not be made (see Failures)
            time_cell = speedup = "n/a"
            row = {"standalone_accuracy_mean": None}
        else:
            time_cell = table_time_cell(row)
            speedup = "n/a" if row["speedup"] is None else f"{row['speedup']:.2f}×"
        frac = _cell([m["throughput_fraction"] for m in metrics], ".2f")
        if name == "local":
            frac += " (one device: the reference)"
        L.append(" | ".join([
            f"| {_row_label(name)}", time_cell, speedup,
            _cell([m["final_accuracy"] for m in metrics], ".3f"),
            _num(row["standalone_accuracy_mean"], ".3f"),
            _cell([m["throughput"] for m in metrics], ".1f"), frac,
            _cell([m["traffic_bytes_per_s"] for m in metrics], ".2f", 1e-6),
            _cell([m["state_requests_per_round"] for m in metrics], ".2f")]) + " |")
    L += ["", "Speedup = SSGD's time to the target / the mode's (same data split); \"n/a\" "
          "when either did not reach it within the budget. Final accuracy: the last scored "
          "checkpoint. Throughput: samples processed by all workers / wall time. Traffic: bytes "
          "the workers pushed and pulled through the KVStore, as counted in the logs. "
          "State-server requests: HTTP calls per worker and round (ESync only).", ""]

    devices = sorted({d for name in names for m in per_rep[name] if m for d in m["devices"]})
    if devices:
        L += _device_tables(names, per_rep, devices)

    figures = [p for p in result["written"] if p.suffix == ".png"]
    L += ["## Figures", ""]
    if figures:
        every = " (the table uses every repeat)" if args.repeats > 1 else ""
        L += [f"Drawn from the first repeat{every}; SVG versions beside the PNGs.", ""]
        for path in figures:
            rel = path.relative_to(out).as_posix()
            L += [f"### {path.stem}", "", f"![{path.stem}]({rel})", ""]
    else:
        L += ["No figures (no mode produced a summary).", ""]
    tables = [p for p in result["written"] if p.suffix in (".md", ".csv")]
    if tables:
        L += ["Speedup table as written by `esync.analysis.table`: "
              + ", ".join(f"[{p.name}]({p.relative_to(out).as_posix()})" for p in tables), ""]

    failed = [j for j in jobs if not j.ok]
    if failed or result["problems"]:
        L += ["## Failures", ""]
        L += [f"- {problem}" for problem in result["problems"]]
        L += [""] if result["problems"] else []
        for job in failed:
            L += [f"### rep {job.rep} `{job.name}`: {job.error}", "",
                  f"Output: [{job.log.relative_to(out).as_posix()}]"
                  f"({job.log.relative_to(out).as_posix()})", "", "```", tail(job.log), "```", ""]

    L += ["## Runs", "", "| Repeat | Mode | Result | Seconds | Mode folder | Output |",
          "| ---: | --- | --- | ---: | --- | --- |"]
    for job in jobs:
        status = "ok" if job.ok else f"failed: {job.error}"
        L.append(f"| {job.rep} | `{job.name}` | {status} | {job.seconds:.0f} | "
                 f"`{job.folder.relative_to(out).as_posix()}` | "
                 f"[log]({job.log.relative_to(out).as_posix()}) |")
    L += ["", "Commands (from the repository root):", "", "```"]
    L += [shlex.join(_display_argv(job.argv)) for job in jobs if job.rep == 1]
    L += ["```", ""]
    return "\n".join(L)


def _device_tables(names: list[str], per_rep: dict, devices: list[str]) -> list[str]:
    L = ["### Computing-time ratio per device", "",
         "Time computing (emulated slow-down included) / wall time.", "",
         "| Mode | " + " | ".join(_device_header(d, per_rep) for d in devices) + " | Mean |",
         "| --- |" + " ---: |" * (len(devices) + 1)]
    for name in names:
        metrics = [m for m in per_rep[name] if m is not None]
        if not metrics:
            continue
        cells = [_cell([m["devices"].get(d, {}).get("computing_time_ratio") for m in metrics],
                       ".2f") for d in devices]
        cells = ["—" if c == "n/a" else c for c in cells]
        L.append(f"| {_row_label(name)} | " + " | ".join(cells) + " | "
                 + _cell([m["mean_computing_time_ratio"] for m in metrics], ".2f") + " |")
    L += ["", "### Throughput per device (samples/s)", "",
          "| Mode | " + " | ".join(_device_header(d, per_rep) for d in devices) + " |",
          "| --- |" + " ---: |" * len(devices)]
    for name in names:
        metrics = [m for m in per_rep[name] if m is not None]
        if not metrics:
            continue
        cells = [_cell([m["devices"].get(d, {}).get("throughput") for m in metrics], ".1f")
                 for d in devices]
        L.append(f"| {_row_label(name)} | "
                 + " | ".join("—" if c == "n/a" else c for c in cells) + " |")
    L.append("")
    return L


def _device_header(device: str, per_rep: dict) -> str:
    for metrics in per_rep.values():
        for m in metrics:
            if m and device in m["devices"] and m["devices"][device]["slowdown"] is not None:
                return f"{device.split('/')[-1]} (×{m['devices'][device]['slowdown']:g})"
    return device.split("/")[-1]


def _display_argv(argv: list[str]) -> list[str]:
    """``python`` for the interpreter, ``main.py`` relative: readable, still runnable."""
    shown = ["python" if a == sys.executable else a for a in argv]
    return ["main.py" if a == str(MAIN) else a for a in shown]


def write_outputs(args, jobs: list[Job], result: dict, *, command: str, started: datetime,
                  seconds: float) -> Path:
    out = Path(args.out)
    report = out / "report.md"
    report.write_text(render_report(args, jobs, result, command=command, started=started,
                                    seconds=seconds), encoding="utf-8")
    data = {
        "command": command, "canonical_command": canonical_command(args),
        "started": started.isoformat(timespec="seconds"), "seconds": round(seconds, 1),
        "config": {"workers": args.workers, "slowdowns": args.slowdowns,
                   "network": args.network, "batch_size": args.batch_size,
                   "budget_s": args.budget, "modes": args.mode_list, "niid": args.niid,
                   "repeats": args.repeats, "policy": args.policy, "target": args.target,
                   "learning_rate": args.learning_rate, "local_lr": args.local_lr,
                   "seed": args.seed, "local_eval_every": args.local_eval_every},
        "physical_limit": result["limits"],
        "modes": {name: result["per_rep"][name] for name in result["names"]},
        "table": result["table"], "problems": result["problems"],
        "runs": [{"rep": j.rep, "name": j.name, "ok": j.ok, "error": j.error,
                  "returncode": j.returncode, "seconds": round(j.seconds, 1),
                  "folder": str(j.folder), "log": str(j.log), "argv": j.argv} for j in jobs],
    }
    (out / "benchmark.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    return report


# ----------------------------------------------------------------------------- main

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
    jobs = plan(args, out)
    started, t0 = datetime.now(), time.monotonic()
    progress = Progress(len(jobs))
    progress.note(f"{len(jobs)} run{'s' if len(jobs) > 1 else ''} of {args.budget:g} s "
                  f"training each; report in {out}")
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        for job in jobs:
            progress.begin(job)
            run_job(job, progress, args.job_timeout)
            progress.end(job)
    except KeyboardInterrupt:
        progress.close()
        print(f"{PROG}: interrupted; the run in progress was stopped; no report", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    progress.close()
    result = analyse(args, jobs, out, progress)
    report = write_outputs(args, jobs, result, command=command, started=started,
                           seconds=time.monotonic() - t0)
    failed = [j for j in jobs if not j.ok]
    print(f"{PROG}: report written to {report}")
    for problem in result["problems"]:
        print(f"{PROG}: {problem}", file=sys.stderr)
    for job in failed:
        print(f"{PROG}: rep {job.rep} {job.name} failed ({job.error}); last lines of {job.log}:\n"
              f"{tail(job.log, 10)}", file=sys.stderr)
    return 1 if failed or result["problems"] else 0


def _sigterm(*_):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
