"""The repeats' spread, and how much of it is the machine's pace.

Why. CPU caps give an emulated device the same share of a core in every run, not the same speed:
the host's cores themselves run faster in one run than in another (in the default benchmark of
2026-11-28, noon, the x1 device of ASGD's shifting row that never slows down computed 56 ms per
iteration in one repeat and 41 ms in the next, under the same cap). A time to target then moves
with the machine as much as with the algorithm. Every run measures its pace anyway: the compute
seconds per sample of its fastest x1 device (``metrics.x1_seconds_per_sample``). Each repeat's
time scaled to the row's median pace (``stats.paced``) leaves the spread that is the runs' own
(seed, timing).

The report's medians and speedups stay raw seconds: this section diagnoses a spread, it does not
replace one. ``esync-benchmark-pace <benchmark folder>`` prints the section for a benchmark
that ran before the report had it (its runs' folders must still exist).

Three repeats say little about how wide a row's spread is; many reports say more.
``esync-benchmark-pace --pool <folder> <folder> ...`` pools every report's repeats of a row
(the standard deviation of ln(time), each time against its own report's mean) and gives the
chance that three repeats of that row stay within a ratio such as 1.3x: how often a bar on the
slowest over the fastest of three can hold at all, whatever the instrument does.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from esync.common import modes
from esync.analysis.summary import LogError, load_summary, summary_name
from esync.benchmark import stats
from esync.benchmark.metrics import x1_seconds_per_sample

PROG = "esync-benchmark-pace"


def section(per_setting: dict[str, dict[str, list]], *, target: float, batch: int,
            labels: dict | None = None) -> list[str]:
    """The report's "Repeats and the machine's pace" lines. ``per_setting[setting][row]``: one
    metrics dict per repeat (None: the run failed) with ``time_to_target`` and
    ``x1_seconds_per_sample``; rows with fewer than two runs, or that never reached the target,
    are left out."""
    labels = labels or {}
    lines, shown = [], set()
    for setting, rows in per_setting.items():
        for name, reps in rows.items():
            runs = [m for m in reps if m is not None]
            times = [m.get("time_to_target") for m in runs]
            if len(runs) < 2 or all(t is None for t in times) or name in shown:
                continue
            if modes.family(name) == modes.STANDALONE:
                shown.add(name)          # the same runs serve every network setting
            paces = [m.get("x1_seconds_per_sample") for m in runs]
            raw = stats.repeat_ratio(stats.spread(times, censored=True))
            at_pace = stats.repeat_ratio(stats.paced_spread(times, paces))
            cells = [", ".join("not reached" if t is None else f"{t:.1f}" for t in times),
                     ", ".join("?" if not p else f"{p * batch * 1000:.1f}" for p in paces),
                     "—" if raw is None else f"{raw:.2f}×",
                     "—" if at_pace is None else f"{at_pace:.2f}×"]
            lines.append(f"| {labels.get(name, name)} | {setting} | " + " | ".join(cells) + " |")
    if not lines:
        return []
    return ["## Repeats and the machine's pace", "",
            "How far apart the repeats of a row are (slowest over fastest time to "
            f"{target:.2f}, where every repeat reached it), and how far apart they would be at "
            "the row's median pace. A run's pace is its fastest ×1 device's compute time per "
            f"iteration (batch {batch}): the same cap in every run, but not the same cores, as "
            "the machine runs faster at some moments than at others. Each repeat's time is "
            "scaled by the row's median pace over its own; what spread is left is the runs' "
            "own (seed, timing). Every other table gives raw seconds.", "",
            f"| Row | Setting | time to {target:.2f} per repeat (s) | ×1 iteration per repeat "
            "(ms) | slowest / fastest | at the row's median pace |",
            "| --- | --- | ---: | ---: | ---: | ---: |", *lines, ""]


def _results(folder: Path) -> tuple[dict, dict, dict]:
    """(benchmark.json, its settings, its config), or a LogError that says what to give;
    ``folder`` may also be the benchmark.json itself."""
    path = folder if folder.name == "benchmark.json" else folder / "benchmark.json"
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
        return found, found["settings"], found["config"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LogError(f"{path}: not a benchmark's results ({exc}); give the folder "
                       "esync-benchmark --out wrote") from exc


def from_folder(folder: Path) -> tuple[dict, dict]:
    """(per setting and row: the repeats' metrics, the benchmark's config) from a benchmark
    folder: its benchmark.json, and each run's summary where the pace was not recorded."""
    found, settings, config = _results(folder)
    folders = {(r.get("setting"), r.get("rep"), r.get("name")): r.get("folder")
               for r in found.get("runs", []) if r.get("rep")}
    per_setting = {}
    for setting, entry in settings.items():
        rows = {}
        for name, reps in entry.get("rows", {}).items():
            rows[name] = []
            for rep, metrics in enumerate(reps, start=1):
                if metrics is not None and metrics.get("x1_seconds_per_sample") is None:
                    folder_ = folders.get((setting, rep, name))
                    if folder_ is None and modes.family(name) == modes.STANDALONE:
                        # one device alone ran once per repeat and serves every network setting
                        folder_ = next((f for (_, r, n), f in folders.items()
                                        if r == rep and n == name), None)
                    metrics = dict(metrics, x1_seconds_per_sample=_pace_of(folder_))
                rows[name].append(metrics)
        per_setting[setting] = rows
    return per_setting, config


def pooled(folders) -> dict[tuple[str, str], list[list[float]]]:
    """``{(setting, row): [one report's times to target, ...]}`` over benchmark folders.

    A report whose repeats share one seed (``--same-seed``) measures the timing alone and is
    left out, as is a row's report where a repeat did not reach the target (its time is only a
    lower bound): the pooled spread is then, if anything, narrower than the rows' own."""
    groups = {}
    for folder in folders:
        _, settings, config = _results(Path(folder))
        seeds = config.get("seeds") or []
        if len(set(seeds)) < len(seeds):
            continue
        standalone_seen = False
        for setting, entry in settings.items():
            for name, reps in entry.get("rows", {}).items():
                if modes.family(name) == modes.STANDALONE:
                    if standalone_seen:
                        continue         # the same runs serve every network setting: once
                    standalone_seen = True
                times = [m.get("time_to_target") if m else None for m in reps]
                if len(times) >= 2 and all(t for t in times):
                    groups.setdefault((setting, name), []).append([float(t) for t in times])
    return groups


def pooled_section(groups: dict, *, ratio: float, repeats: int, min_reports: int) -> list[str]:
    """The table ``--pool`` prints: per setting and row seen in ``min_reports`` reports or
    more, the pooled standard deviation of ln(time) and the chance ``repeats`` runs stay
    within ``ratio``."""
    lines = []
    for (setting, name), times in sorted(groups.items()):
        found = stats.pooled_log_sigma(times)
        if len(times) < min_reports or found is None:
            continue
        sigma, _ = found
        ratios = sorted(max(t) / min(t) for t in times)
        chance = stats.chance_within(ratio, sigma, repeats)
        lines.append(f"| {name} | {setting} | {len(times)} | {sum(map(len, times))} | "
                     f"{sigma:.3f} | {ratios[len(ratios) // 2]:.2f}× | "
                     f"{sum(r <= ratio for r in ratios)} of {len(ratios)} | {chance:.2f} |")
    if not lines:
        return []
    return [f"| Row | Setting | reports | runs | σ of ln(time to target) | median slowest / "
            f"fastest | reports within {ratio:g}× | chance {repeats} repeats within {ratio:g}× |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |", *lines]


def _pace_of(mode_dir: str | None) -> float | None:
    """The pace from a run's summary (None when the run's folder is gone)."""
    if not mode_dir:
        return None
    try:
        return x1_seconds_per_sample(load_summary(Path(mode_dir)
                                                  / summary_name(Path(mode_dir).name)))
    except (LogError, OSError):
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=(
        "Print a benchmark's repeats section: each row's spread between repeats, raw and at the "
        "row's median pace (the machine's speed in each run, from the runs' own logs). With "
        "--pool: every row's spread pooled over several benchmarks, and the chance that a "
        "given number of repeats stays within a ratio."))
    parser.add_argument("folders", type=Path, nargs="+", metavar="folder",
                        help="the folder esync-benchmark --out wrote (with --pool: one or more)")
    parser.add_argument("--pool", action="store_true",
                        help="pool each row's repeats over the folders given (reports that ran "
                             "with --same-seed are left out)")
    parser.add_argument("--ratio", type=float, default=1.3,
                        help="--pool: the slowest-over-fastest bar (default: 1.3)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="--pool: how many repeats the chance is for (default: 3)")
    parser.add_argument("--min-reports", type=int, default=3,
                        help="--pool: leave out rows seen in fewer reports (default: 3)")
    args = parser.parse_args(argv)
    if not args.pool and len(args.folders) > 1:
        parser.error("give one benchmark folder, or --pool to pool several")
    if not args.ratio > 1 or args.repeats < 2 or args.min_reports < 1:     # nan too
        parser.error("--ratio must be above 1, --repeats at least 2, --min-reports at least 1")
    try:
        if args.pool:
            lines = pooled_section(pooled(args.folders), ratio=args.ratio,
                                   repeats=args.repeats, min_reports=args.min_reports)
            empty = f"no row reached the target in {args.min_reports} or more of the reports"
        else:
            per_setting, config = from_folder(args.folders[0])
            lines = section(per_setting, target=config.get("target", 0.85),
                            batch=config.get("batch_size", 64))
            empty = f"no row ran twice or more in {args.folders[0]}"
    except LogError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines) if lines else f"{PROG}: {empty}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
