"""The report's numbers: per run from its summary, the physical limit, the tuning's choice, and
per setting the aggregates over repeats (``stats``)."""
from __future__ import annotations

import math
import os

from esync.common import modes
from esync.analysis.summary import LogError, device_entries, load_summary, write_summary
from esync.analysis.table import (accuracy_series, cluster_totals, mean_std,
                                  time_to_accuracy)
from esync.benchmark import stats
from esync.benchmark.options import sync_cap
from esync.benchmark.plan import Job, row_budget

__all__ = ["mean_std", "physical_limit", "run_metrics", "x1_seconds_per_sample", "summarise",
           "best_learning_rates", "results"]


def summarise(job: Job) -> None:
    """Summarise the job's mode folder (fresh, whatever the launcher wrote)."""
    try:
        job.summary = load_summary(write_summary(job.folder))
    except (LogError, OSError) as exc:
        job.error = f"no summary: {exc}"
    except Exception as exc:      # a bug in the analysis must not cost the other modes' report
        job.error = f"no summary: {type(exc).__name__}: {exc}"


def physical_limit(local_summary: dict | None, slowdowns: list[float],
                   cores: int | None = None, share: float | None = None,
                   one_machine: bool = True) -> dict:
    """What the emulated cluster could process at most, in samples/s.

    Each device ``i`` can at best run at one device's standalone throughput ``tp`` over its
    slow-down ``F_i``, and all of them together can use at most the machine's cores:
    ``min(Σ tp / F_i, cores × tp per core)``. Under the sleep emulation the slowed devices wait
    without using the CPU and the standalone run has a whole core, so a core gives ``tp``. Under
    CPU caps the standalone run had ``share`` of a core (the x1 device's cap), so a core gives
    ``tp / share``; the caps are sized to fit the cores, so ``Σ tp / F_i`` is the limit. On
    real machines (``one_machine`` False) every device has its own hardware and ``F_i`` are
    the probes' measured slow-downs: the limit is ``Σ tp / F_i`` alone.
    """
    cores = cores or os.cpu_count() or 1
    empty = {"standalone_throughput": None, "cluster_limit": None, "devices_sum": None,
             "cores_bound": None, "cores": cores, "share": share}
    if local_summary is None:
        return empty
    tp = cluster_totals(local_summary).get("throughput")
    if tp is None:
        return empty
    devices_sum = sum(tp / f for f in slowdowns)
    cores_bound = cores * tp / (share or 1.0) if one_machine else None
    return {"standalone_throughput": tp, "devices_sum": devices_sum, "cores_bound": cores_bound,
            "cluster_limit": devices_sum if cores_bound is None else min(devices_sum,
                                                                         cores_bound),
            "cores": cores, "share": share}


def x1_seconds_per_sample(summary: dict) -> float | None:
    """The machine's pace in a run: compute seconds per sample of its fastest x1 device
    (the devices of the smallest slow-down; the fastest of them, as a speed schedule can slow
    one down). Under CPU caps every run gives a device the same share of a core, but the cores
    themselves run faster in some runs than in others; this measures how fast they ran."""
    paces = {}
    for _, _, entry in device_entries(summary):
        samples = sum(entry.get("num_samples_list") or [])
        computed = entry.get("compute_time_list") or []
        if samples > 0 and computed and None not in computed:
            factor = entry.get("slowdown") or 1.0
            paces.setdefault(factor, []).append(sum(computed) / samples)
    return min(paces[min(paces)]) if paces else None


def accuracy_until(summary: dict, horizon: float | None) -> tuple[list, list] | None:
    """The accuracy records in time order up to the first one at or after ``horizon`` seconds
    (all when None).

    A run with a budget stops at the first round that ends after it, and checkpoints there, so
    its last record lies a little past the budget. A run that went on (SSGD for Table 1) has no
    record at that round; its first checkpoint at or after the budget stands for it. That gives
    it up to one checkpoint interval more training than a run with the budget: the cut errs in
    SSGD's favour, never against it.
    """
    series = accuracy_series(summary)
    if series is None:
        return None
    pairs = sorted(zip(series[0], series[1]))
    if horizon is not None:
        after = next((i for i, (t, _) in enumerate(pairs) if t >= horizon), None)
        pairs = pairs if after is None else pairs[:after + 1]
    return [t for t, _ in pairs], [a for _, a in pairs]


def late_mean(series: tuple[list, list] | None) -> float | None:
    """The mean test accuracy of the checkpoints in the second half of ``series`` (times,
    accuracies): one checkpoint on class-ordered data moves by ±0.1 with where the devices
    stand in their class order, so the last one alone says little about a row."""
    if not series or not series[0]:
        return None
    half = max(series[0]) / 2
    late = [a for t, a in zip(*series) if t >= half]
    if any(a is None or math.isnan(a) for a in late):
        return math.nan                           # a run that diverged
    return sum(late) / len(late)


def phase_throughput(summary: dict, switch: float) -> tuple[float | None, float | None]:
    """Cluster samples/s before and after ``switch`` seconds (the shifting scenario's change):
    samples of the rounds that ended by then over ``switch``, the rest over the remaining time."""
    entries = [e for _, _, e in device_entries(summary)]
    ends = [e["elapsed_time_list"][-1] for e in entries if e.get("elapsed_time_list")]
    if not ends:
        return None, None
    wall = max(ends)
    before = after = 0
    for e in entries:
        for t, n in zip(e.get("elapsed_time_list") or [], e.get("num_samples_list") or []):
            if t <= switch:
                before += n
            else:
                after += n
    return (before / switch if switch > 0 else None,
            after / (wall - switch) if wall > switch else None)


def read_links(folder) -> dict | None:
    """The link counters a --net netns run recorded (``links.json``), or None."""
    import json
    from esync.common.runlayout import links_file
    try:
        return json.loads(links_file(folder).read_text())
    except (OSError, ValueError):
        return None


def link_metrics(links: dict | None, rounds: int) -> dict:
    """Bytes per round that crossed the links, measured by the kernel: the busiest worker
    host's and the ps host's, each the more of what it sent and received."""
    empty = {"worker_link_bytes_per_round": None, "server_link_bytes_per_round": None}
    if not links or not rounds:
        return empty
    hosts = links.get("hosts", {})

    def busiest(names):
        loads = [max(hosts[n]["sent"], hosts[n]["received"]) for n in names if n in hosts]
        return max(loads) / rounds if loads else None
    return {"worker_link_bytes_per_round": busiest(set(links.get("worker_hosts", []))),
            "server_link_bytes_per_round": busiest([links.get("ps_host", "ps")])}


def run_metrics(summary: dict, limit: dict, *, standalone: bool, target: float | None = None,
                table1_target: float | None = None, horizon: float | None = None,
                switch: float | None = None, links: dict | None = None) -> dict:
    """The report's figures for one run, straight from its summary.

    ``horizon``: a run that went on past the common budget (SSGD for Table 1) is judged on its
    records up to its first at or after the budget (time to target, final accuracy: see
    ``accuracy_until``), and on all of them for the ``_uncut`` times. Throughput and traffic
    are whole-run figures (steady state).
    """
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
    cut, whole = accuracy_until(summary, horizon), accuracy_until(summary, None)
    exchanges = sum(d["rounds"] for d in devices.values())
    pushed, pulled = t.get("bytes_pushed"), t.get("bytes_pulled")
    found = {
        "throughput": throughput,
        "limit": bound,
        "throughput_fraction": (throughput / bound if throughput is not None and bound
                                else None),
        "traffic_bytes_per_s": t.get("traffic_bytes_per_s"),
        "bytes_pushed": pushed, "bytes_pulled": pulled,
        # what one worker's link carries out per exchange, and what a server sending every
        # worker its pull would carry per round (rounds are equal over the devices of ESync
        # and SSGD): the parameter server's busiest link
        "exchange_bytes": pushed / exchanges if pushed and exchanges else None,
        "server_bytes_per_round": (pulled * len(devices) / exchanges
                                   if pulled and exchanges else None),
        "state_requests_per_round": t.get("state_requests_per_round"),
        "mean_computing_time_ratio": t.get("mean_computing_time_ratio"),
        "wall_time": t.get("wall_time"), "samples": t.get("samples"),
        "final_accuracy": cut[1][-1] if cut and cut[1] else None,
        "late_accuracy": late_mean(cut),
        "time_to_target": _time_to(cut, target),
        "time_to_target_uncut": _time_to(whole, target),
        # the checkpoint at or after the crossing (what the report showed before 2026-11-25)
        "time_to_target_checkpoint": _time_to(cut, target, interpolate=False),
        "time_to_table1": _time_to(cut, table1_target),
        "time_to_table1_uncut": _time_to(whole, table1_target),
        "horizon": horizon,
        # when the records the tables use end, and when the run's records end (figures)
        "cut_s": cut[0][-1] if cut and cut[0] else None,
        "last_record_s": whole[0][-1] if whole and whole[0] else None,
        "accuracy_source": None if series is None else series[2],
        "x1_seconds_per_sample": x1_seconds_per_sample(summary),
        "devices": devices,
    }
    found.update(link_metrics(links, max((d["rounds"] for d in devices.values()), default=0)))
    if switch is not None:
        found["throughput_before"], found["throughput_after"] = phase_throughput(summary, switch)
    return found


def _time_to(series, target, *, interpolate: bool = True) -> float | None:
    """When the accuracy curve crossed ``target``, interpolated between the checkpoints around
    the crossing (see ``time_to_accuracy``)."""
    if series is None or target is None or not series[0]:
        return None
    return time_to_accuracy(series[0], series[1], target, interpolate=interpolate)


def tuning_score(job: Job) -> float:
    """A short run's mean test accuracy over the checkpoints of its second half; a failed or
    diverged run scores -inf.

    One checkpoint is one sample of a curve that moves: on by-class data the accuracy swings by
    0.1 from one checkpoint to the next as the fast devices change class, and the last one
    picked a rate by its luck (ESync sum on -s 1 chose 9.5e-05 for 0.233 after 10 s, then ended
    its 40 s runs at 0.32, where 0.0003 ends at 0.46). The second half's mean also rewards a
    rate that gets there early, which time to target measures.
    """
    if not job.ok:
        return -math.inf
    late = late_mean(accuracy_until(job.summary, None))
    return -math.inf if late is None or math.isnan(late) else late


TUNING_TOLERANCE = 0.01   # a short run's score moves about this much between seeds


def best_learning_rates(jobs: list[Job]) -> dict[str, dict]:
    """``{group: {"lr", "scores": {lr: score or None}, "seeds": {lr: runs}, "budget",
    "short_scores"}}``: the smallest rate whose short runs scored (``tuning_score``, the mean
    over the rate's seeds) within ``TUNING_TOLERANCE`` of the best one.

    One short run cannot tell scores that close apart, and of two such rates the larger is the
    likelier to diverge in a repeat with another seed (standalone SGD at 0.0095 scored 0.827
    against 0.003's 0.822, then ended at chance in one of three repeats); the best rates also
    run with a second seed (``plan.confirming_jobs``). A failed run never wins: its rate scores
    None; a group whose every run failed keeps None as its rate (the caller falls back to
    -l/-ll). Where a group ran some rates again for longer (``plan.lengthening_jobs``), only
    its longest runs decide (``budget``); the shorter runs' scores stay in ``short_scores``.
    """
    groups: dict[str, dict] = {}
    runs: dict[str, dict[float, list[float]]] = {}
    short: dict[str, dict[float, list[float]]] = {}
    longest: dict[str, float] = {}
    for job in jobs:
        longest[job.row.group] = max(longest.get(job.row.group, 0.0), job.budget)
    for job in jobs:
        group = job.row.group
        groups.setdefault(group, {"lr": None, "scores": {}, "seeds": {},
                                  "budget": longest[group], "short_scores": {}})
        kept = runs if job.budget >= longest[group] else short
        kept.setdefault(group, {}).setdefault(job.lr, []).append(tuning_score(job))
    for group, entry in groups.items():
        for lr, scores in short.get(group, {}).items():
            entry["short_scores"][lr] = (None if -math.inf in scores
                                         else sum(scores) / len(scores))
        for lr, scores in runs[group].items():
            failed = any(score == -math.inf for score in scores)
            entry["scores"][lr] = None if failed else sum(scores) / len(scores)
            entry["seeds"][lr] = len(scores)
        known = {lr: s for lr, s in entry["scores"].items() if s is not None}
        if known:
            best = max(known.values())
            entry["lr"] = min(lr for lr, s in known.items() if s >= best - TUNING_TOLERANCE)
    return groups


def results(args, jobs: list[Job], setting_names: list[str], *,
            standalone_share: float | None = None) -> dict:
    """Per setting: runs by repeat, metrics per row and repeat, their aggregates (median,
    min–max, speedups from medians) and, for the static settings, Table 1's rows.

    The standalone run serves every static network setting (no network involved); the shifting
    scenario compares only its own rows. ``standalone_share``: the CPU cap the standalone runs
    had (None: a whole core), for the physical limit.
    """
    by_setting = {}
    first = next((j.setting.name for j in jobs if j.setting.scenario == "static"), None)
    for name in setting_names:
        setting = next((j.setting for j in jobs if j.setting.name == name), None)
        scenario = setting.scenario if setting else "static"
        mine = [j for j in jobs if j.setting.name == name]
        runs = [{} for _ in range(args.repeats)]
        for job in mine:
            if job.ok:
                runs[job.rep - 1][job.row.name] = job.summary
        shared = [j for j in jobs if j.standalone and j.setting.name == first] \
            if scenario == "static" else []
        for job in shared:
            if job.ok:
                runs[job.rep - 1].setdefault(job.row.name, job.summary)
        names = list(dict.fromkeys(j.row.name for j in mine + shared))
        kind = {j.row.name: j for j in mine + shared}
        limits = [physical_limit(run.get(modes.STANDALONE), args.slowdowns,
                                 share=standalone_share,
                                 one_machine=not getattr(args, "machines", None))
                  for run in runs]
        switch = setting.switch_s if setting is not None else None
        per_rep = {}
        for n in names:
            per_rep[n] = []
            for i, run in enumerate(runs):
                job = next((j for j in mine + shared if j.row.name == n and j.rep == i + 1),
                           None)
                if n not in run:
                    per_rep[n].append(None)
                    continue
                per_rep[n].append(run_metrics(
                    run[n], limits[i], standalone=kind[n].standalone, target=args.target,
                    table1_target=args.table1_target,
                    horizon=row_budget(args, kind[n].row)
                    if job is not None and job.extended else None,
                    switch=switch, links=read_links(job.folder) if job is not None else None))
        entry = {"scenario": scenario, "runs": runs, "names": names, "limits": limits,
                 "per_rep": per_rep, "rows": stats.aggregate(per_rep, horizon={
                     n: row_budget(args, kind[n].row) for n in names})}
        if scenario == "static":
            entry["table1"] = stats.table1(per_rep, budget=args.budget, sync_cap=sync_cap(args))
        by_setting[name] = entry
    return by_setting
