"""The report's numbers: per run from its summary, the physical limit, the tuning's choice."""
from __future__ import annotations

import math
import os

from esync.common import modes
from esync.analysis.summary import LogError, device_entries, load_summary, write_summary
from esync.analysis.table import (accuracy_series, cluster_totals, final_accuracy, mean_std,
                                  speedup_table)
from esync.benchmark.plan import Job

__all__ = ["mean_std", "physical_limit", "run_metrics", "summarise", "best_learning_rates",
           "results"]


def summarise(job: Job) -> None:
    """Summarise the job's mode folder (fresh, whatever the launcher wrote)."""
    try:
        job.summary = load_summary(write_summary(job.folder))
    except (LogError, OSError) as exc:
        job.error = f"no summary: {exc}"
    except Exception as exc:      # a bug in the analysis must not cost the other modes' report
        job.error = f"no summary: {type(exc).__name__}: {exc}"


def physical_limit(local_summary: dict | None, slowdowns: list[float],
                   cores: int | None = None) -> dict:
    """What the emulated cluster could process at most, in samples/s.

    Each device ``i`` can at best run at one device's standalone throughput ``tp`` over its
    slow-down ``F_i``; and the emulated slow-down waits without using the CPU, so all of them
    together can use at most the machine's cores: ``min(Σ tp / F_i, cores × tp)``.
    """
    cores = cores or os.cpu_count() or 1
    if local_summary is None:
        return {"standalone_throughput": None, "cluster_limit": None, "devices_sum": None,
                "cores_bound": None, "cores": cores}
    tp = cluster_totals(local_summary).get("throughput")
    if tp is None:
        return {"standalone_throughput": None, "cluster_limit": None, "devices_sum": None,
                "cores_bound": None, "cores": cores}
    devices_sum = sum(tp / f for f in slowdowns)
    cores_bound = cores * tp
    return {"standalone_throughput": tp, "devices_sum": devices_sum, "cores_bound": cores_bound,
            "cluster_limit": min(devices_sum, cores_bound), "cores": cores}


def run_metrics(summary: dict, limit: dict, *, standalone: bool) -> dict:
    """The report's figures for one run, straight from its summary."""
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


def tuning_score(job: Job) -> float:
    """A short run's final test accuracy; a failed or diverged run scores -inf."""
    if not job.ok:
        return -math.inf
    accuracy = final_accuracy(job.summary)
    return -math.inf if accuracy is None or math.isnan(accuracy) else accuracy


def best_learning_rates(jobs: list[Job]) -> dict[str, dict]:
    """``{group: {"lr", "scores": {lr: accuracy or None}}}``; ties go to the smaller rate.

    A group whose every run failed keeps None as its rate (the caller falls back to -l/-ll).
    """
    groups: dict[str, dict] = {}
    for job in jobs:
        entry = groups.setdefault(job.row.group, {"lr": None, "scores": {}, "best": -math.inf})
        score = tuning_score(job)
        entry["scores"][job.lr] = None if score == -math.inf else score
        if score > entry["best"] or (score == entry["best"] and entry["lr"] is not None
                                     and job.lr < entry["lr"] and score > -math.inf):
            entry["best"], entry["lr"] = score, job.lr
    for entry in groups.values():
        entry.pop("best")
    return groups


def results(args, jobs: list[Job], setting_names: list[str]) -> dict:
    """Per setting: runs by repeat, metrics per row and repeat, the speedup table."""
    by_setting = {}
    labels = {job.row.name: job.row.label for job in jobs}
    for name in setting_names:
        mine = [j for j in jobs if j.setting.name == name
                or (not modes.get(j.row.mode).cluster and name == setting_names[0])]
        runs = [{} for _ in range(args.repeats)]
        for job in mine:
            if job.ok:
                runs[job.rep - 1][job.row.name] = job.summary
        # The standalone run is shared by every setting (no network involved).
        shared = [j for j in jobs if not modes.get(j.row.mode).cluster and j.ok]
        for job in shared:
            runs[job.rep - 1].setdefault(job.row.name, job.summary)
        names = list(dict.fromkeys(j.row.name for j in mine + shared))
        limits = [physical_limit(run.get(modes.STANDALONE), args.slowdowns) for run in runs]
        per_rep = {n: [run_metrics(run[n], limits[i], standalone=not modes.get(
                           _mode_of(jobs, n)).cluster) if n in run else None
                       for i, run in enumerate(runs)] for n in names}
        table = speedup_table(runs, target=args.target, labels=labels) if any(runs) else []
        by_setting[name] = {"runs": runs, "names": names, "limits": limits,
                            "per_rep": per_rep, "table": table}
    return by_setting


def _mode_of(jobs: list[Job], row_name: str) -> str:
    return next(j.row.mode for j in jobs if j.row.name == row_name)
