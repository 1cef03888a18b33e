"""The paper's Table 1 for our runs: time to a target accuracy, speedup over SSGD, accuracy.

Per mode folder (``esync``, ``sync``, ..., ``*-niid``), over one or more repeated runs (log roots
holding the same ``<network>/<mode>/`` layout):

- time to reach the target test accuracy (default 0.80): the first recorded time whose accuracy is
  at least the target, averaged over the runs; "not reached" unless every run reached it;
- speedup over ``sync`` of the same data split: sync's time / the mode's time;
- final test accuracy (the last record), mean ± std over runs (sample std; 0 with n=1), next to
  standalone SGD's (the ``local`` folder);
- cluster throughput (samples/s) and the mean computing-time ratio, averaged over runs.

Accuracy comes from the evaluator's records (``_evaluator``) when present, else from the device
that logged accuracies (rank 0's, as in the original). ``drawer.py`` writes the table as
``speedup.md`` and ``speedup.csv``. Plain Python: no matplotlib, no MXNet.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Iterable, Sequence

from esync.common import modes
from esync.analysis.summary import device_entries

MODE_ORDER = modes.NAMES
BASELINE = modes.BASELINE
STANDALONE = modes.STANDALONE

CSV_COLUMNS = ("mode", "label", "runs", "runs_reached", "target", "time_to_target_s", "speedup",
               "best_other", "speedup_vs_best_other",
               "final_accuracy_mean", "final_accuracy_std", "final_accuracy_runs",
               "standalone_accuracy_mean", "standalone_accuracy_std",
               "throughput_samples_per_s", "computing_time_ratio")


def mode_label(mode: str) -> str:
    """``"sync-niid"`` -> ``"SSGD (non-i.i.d.)"``; unknown folder names stay as they are."""
    return modes.label(mode)


def mode_sort_key(mode: str) -> tuple:
    """Known modes first in the paper's order, i.i.d. before non-i.i.d., then the rest by name."""
    return modes.sort_key(mode)


def time_to_accuracy(elapsed: Sequence[float], acc: Sequence[float],
                     target: float, *, interpolate: bool = False) -> float | None:
    """The first time (in time order) with an accuracy of at least ``target``; None if never.

    ``interpolate``: where the curve crossed the target between two checkpoints, linearly
    between them, rather than the checkpoint after the crossing. The checkpoint alone is late
    by up to one checkpoint interval, so two runs that crossed a moment apart can differ by a
    whole interval (4 s in the benchmark's clusters).
    """
    if len(elapsed) != len(acc):
        raise ValueError(f"{len(elapsed)} times but {len(acc)} accuracies")
    previous = None
    for seconds, accuracy in sorted(zip(elapsed, acc), key=lambda pair: pair[0]):
        if accuracy >= target:
            if not interpolate or previous is None:
                return seconds
            t0, a0 = previous
            return t0 + (target - a0) / (accuracy - a0) * (seconds - t0)
        previous = (seconds, accuracy)
    return None


def accuracy_series(summary: dict) -> tuple[list[float], list[float], str] | None:
    """``(times, accuracies, source)`` of a summary, or None when it holds no accuracy.

    The evaluator's records win; otherwise the device that logged accuracies (rank 0 if known,
    else the one with the most records). Summaries from the original's summary.py have no
    ``accuracy_time_list``; their ``elapsed_time_list`` is used when it lines up.
    """
    evaluator = summary.get("_evaluator")
    if evaluator and evaluator.get("accuracy_list"):
        return list(evaluator["elapsed_time_list"]), list(evaluator["accuracy_list"]), "evaluator"
    candidates = []
    for host, device, entry in device_entries(summary):
        accs = entry.get("accuracy_list") or []
        times = entry.get("accuracy_time_list")
        if times is None and len(entry.get("elapsed_time_list") or []) == len(accs):
            times = entry["elapsed_time_list"]
        if accs and times is not None and len(times) == len(accs):
            candidates.append((entry.get("rank") != 0, -len(accs), host, device, times, accs))
    if not candidates:
        return None
    _, _, host, device, times, accs = min(candidates, key=lambda c: c[:4])
    return list(times), list(accs), f"{host}/{device}"


def final_accuracy(summary: dict) -> float | None:
    """The last accuracy in time order, or None."""
    series = accuracy_series(summary)
    if series is None:
        return None
    times, accs, _ = series
    return max(zip(times, range(len(times)), accs))[2]


def cluster_totals(summary: dict) -> dict:
    """``_totals`` of a summary; for one from the original's summary.py, what can be derived."""
    if isinstance(summary.get("_totals"), dict):
        return summary["_totals"]
    entries = [e for _, _, e in device_entries(summary)]
    wall = max((e["elapsed_time_list"][-1] for e in entries if e.get("elapsed_time_list")),
               default=0)
    samples = sum(sum(e.get("num_samples_list") or []) for e in entries)
    return {"num_devices": len(entries), "samples": samples, "wall_time": wall,
            "throughput": samples / wall if wall > 0 else None, "traffic_bytes_per_s": None,
            "mean_computing_time_ratio": None}


def mean_std(values: Iterable[float]) -> tuple[float | None, float | None, int]:
    """Mean, sample standard deviation (0 for one value) and count; (None, None, 0) when empty."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None, 0
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0, 1
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var), len(values)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def speedup_table(runs: Sequence[dict], *, target: float = 0.8,
                  labels: dict[str, str] | None = None) -> list[dict]:
    """One row per mode over repeated runs; each run is ``{mode_dir_name: summary}``.

    Row names may be variants of a registry mode (the benchmark's ``esync-fednova-niid``):
    ``labels`` then gives their labels. ``speedup`` is over SSGD of the same data split;
    ``speedup_vs_best_other`` is over the fastest row of another mode (same split, or one
    device alone), named in ``best_other``. Row keys are ``CSV_COLUMNS``; figures that cannot
    be had are None.
    """
    labels = labels or {}
    names = sorted({name for run in runs for name in run}, key=mode_sort_key)
    rows = {}
    for name in names:
        summaries = [run[name] for run in runs if name in run]
        times = []
        for summary in summaries:
            series = accuracy_series(summary)
            times.append(None if series is None else time_to_accuracy(series[0], series[1], target))
        reached = [t for t in times if t is not None]
        acc_mean, acc_std, acc_n = mean_std(final_accuracy(s) for s in summaries)
        rows[name] = {
            "mode": name, "label": labels.get(name) or mode_label(name), "runs": len(summaries),
            "runs_reached": len(reached), "target": target,
            "time_to_target_s": sum(reached) / len(reached) if len(reached) == len(times) else None,
            "final_accuracy_mean": acc_mean, "final_accuracy_std": acc_std,
            "final_accuracy_runs": acc_n,
            "throughput_samples_per_s": _mean(cluster_totals(s).get("throughput")
                                              for s in summaries),
            "computing_time_ratio": _mean(cluster_totals(s).get("mean_computing_time_ratio")
                                          for s in summaries),
        }
    for name, row in rows.items():
        family, split = modes.family(name), modes.parse_folder(name)[1]
        baseline = rows.get(BASELINE + split.suffix)
        row["speedup"] = _ratio(None if baseline is None else baseline["time_to_target_s"],
                                row["time_to_target_s"])
        others = [r for other, r in rows.items()
                  if modes.family(other) != family and r["time_to_target_s"] is not None
                  and (modes.parse_folder(other)[1] == split or modes.family(other) == STANDALONE)]
        best = min(others, key=lambda r: r["time_to_target_s"], default=None)
        row["best_other"] = None if best is None else best["mode"]
        row["speedup_vs_best_other"] = _ratio(None if best is None else best["time_to_target_s"],
                                              row["time_to_target_s"])
        standalone = rows.get(STANDALONE) or rows.get(STANDALONE + split.suffix) or {}
        row["standalone_accuracy_mean"] = standalone.get("final_accuracy_mean")
        row["standalone_accuracy_std"] = standalone.get("final_accuracy_std")
    return [{key: rows[name][key] for key in CSV_COLUMNS} for name in names]


def _ratio(reference: float | None, time: float | None) -> float | None:
    return reference / time if reference is not None and time else None


# ----------------------------------------------------------------------------- writing

def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _accuracy_cell(mean, std, n) -> str:
    return "n/a" if mean is None else f"{mean:.3f} ± {std:.3f} (n={n})"


def time_cell(row: dict) -> str:
    """The "time to target" cell, shared by the speedup table and the benchmark report."""
    if row["time_to_target_s"] is not None:
        return f"{row['time_to_target_s']:.1f}"
    if row["runs_reached"]:
        return f"not reached ({row['runs_reached']}/{row['runs']} runs reached it)"
    return "not reached"


def best_other_cell(row: dict, labels: dict[str, str]) -> str:
    """``"1.50× (over ASGD)"``: the speedup over the fastest row of another mode."""
    if row.get("speedup_vs_best_other") is None:
        return "n/a"
    other = labels.get(row["best_other"], row["best_other"])
    return f"{row['speedup_vs_best_other']:.2f}× (over {other})"


def to_markdown(rows: Sequence[dict], *, network: str, target: float) -> str:
    """The table as Markdown, with a header line saying the network, target and runs."""
    n_runs = max((row["runs"] for row in rows), default=0)
    roots = f"{n_runs} log roots" if n_runs != 1 else "1 log root; n=1: std is 0"
    lines = [
        f"# Speedup and accuracy — {network}",
        "",
        f"Target test accuracy {target:.2f}; speedup = SSGD's time to target / the mode's "
        f"(same data split); accuracies are the final ones, mean ± sample std over n runs "
        f"({roots}).",
        "",
        f"| Mode | Runs | Time to {target:.2f} (s) | Speedup vs SSGD "
        "| Speedup vs the best other mode | Final accuracy "
        "| Standalone SGD accuracy | Throughput (samples/s) | Computing-time ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(" | ".join([
            f"| {row['label']}", str(row["runs"]), time_cell(row),
            "n/a" if row["speedup"] is None else f"{row['speedup']:.2f}×",
            best_other_cell(row, {r["mode"]: r["label"] for r in rows}),
            _accuracy_cell(row["final_accuracy_mean"], row["final_accuracy_std"],
                           row["final_accuracy_runs"]),
            "n/a" if row["standalone_accuracy_mean"] is None else
            f"{row['standalone_accuracy_mean']:.3f} ± {row['standalone_accuracy_std']:.3f}",
            _fmt(row["throughput_samples_per_s"], ".1f"),
            _fmt(row["computing_time_ratio"], ".3f"),
        ]) + " |")
    return "\n".join(lines) + "\n"


def write_table(rows: Sequence[dict], out_dir, *, network: str, target: float) -> list[Path]:
    """Write ``speedup.md`` and ``speedup.csv`` (empty cells for missing figures) into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "speedup.md"
    md.write_text(to_markdown(rows, network=network, target=target), encoding="utf-8")
    path_csv = out_dir / "speedup.csv"
    with path_csv.open("w", newline="", encoding="utf-8") as fp:
        writer = csv.DictWriter(fp, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return [md, path_csv]
