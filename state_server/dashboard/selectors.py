"""Reads for the dashboard: everything one refresh of the page shows, as JSON-ready data.

Sources, so that both policies look the same: the live state of the policy (every worker's k, c,
requests and the slowest, ``coordination.selectors.job_state``), the closed rounds it recorded
(k, compute and waiting time per worker and round, ``job_history``) and this app's tables
(host, device and slow-down factor from each worker's ``hello``, the evaluator's scores). Under the dynamic policy
the live k counts the local iterations reported so far this round; under the planned policy it is
the k the state server decided.
"""
from __future__ import annotations

from coordination import selectors as coordination
from coordination.models import Job

from .models import Score, WorkerInfo

RECENT_ROUNDS = 60       # rounds in the k_i chart
RATE_ROUNDS = 10         # closed rounds behind the round rate and the compute/wait split


def job_choices() -> list[dict]:
    """Every job, the most recently active first (the page's default choice)."""
    return [{"name": job.name, "policy": job.policy, "num_workers": job.num_workers,
             "round": job.current_round, "run": job.run}
            for job in Job.objects.order_by("-updated_at", "name")]


def job_dashboard(*, name: str) -> dict:
    """One refresh of the page for job ``name`` (raises JobNotFound)."""
    live = coordination.job_state(name=name)
    current = int(live.get("round") or 1)
    history = coordination.job_history(name=name, since=max(1, current - RECENT_ROUNDS),
                                       limit=RECENT_ROUNDS + 1)
    rounds = [r for r in history["rounds"] if r["workers"]][-RECENT_ROUNDS:]
    recent = rounds[-RATE_ROUNDS:]
    job = Job.objects.get(name=name)
    infos = {info.rank: info for info in WorkerInfo.objects.filter(job=job)}
    workers = [_worker_row(w, live, rounds, recent, infos.get(w["rank"]))
               for w in live["workers"]]
    return {
        "job": name, "policy": live["policy"], "epsilon": live.get("epsilon"),
        "num_workers": live["num_workers"], "run": history["run"], "round": current,
        "slowest": live.get("slowest"), "rounds_per_second": _round_rate(recent),
        "workers": workers,
        "recent_rounds": [{"round": r["round"], "k": _by_rank(r, "k", live["num_workers"])}
                          for r in rounds],
        "scores": [{"round": s.round, "time": s.time, "accuracy": s.accuracy}
                   for s in Score.objects.filter(job=job, run=history["run"]).order_by("round")],
    }


def _worker_row(w: dict, live: dict, rounds: list, recent: list, info) -> dict:
    rank = w["rank"]
    mine = [rec for r in recent for rec in r["workers"] if rec["rank"] == rank]
    compute = sum(rec["compute"] for rec in mine)
    wait = sum(rec["wait"] for rec in mine)
    last = next((rec for r in reversed(rounds) for rec in r["workers"] if rec["rank"] == rank),
                None)
    live_k = w.get("planned_k") if live["policy"] == "planned" else w.get("k")
    return {
        "rank": rank, "device": info.device if info else None, "host": info.host if info else None,
        "slowdown": info.slowdown if info else None,
        "round": w.get("round"), "k": last["k"] if last else live_k, "k_live": live_k,
        "c": w.get("c"), "requests": w.get("requests"),
        "compute": round(compute, 6), "wait": round(wait, 6),
        "compute_share": round(compute / (compute + wait), 4) if compute + wait > 0 else None,
        "slowest": rank == live.get("slowest") and bool(w.get("c")),
        # judged too slow to set the rounds (--sit-out-ratio): never the slowest, whatever its c
        "sits_out": bool(w.get("sits_out")),
    }


def _round_rate(recent: list) -> float | None:
    """Closed rounds per second: every worker spends the whole round computing or waiting."""
    durations = [sum(rec["compute"] + rec["wait"] for rec in r["workers"]) / len(r["workers"])
                 for r in recent]
    total = sum(durations)
    return round(len(durations) / total, 4) if total > 0 else None


def _by_rank(round_: dict, key: str, num_workers: int) -> list:
    values = [None] * num_workers
    for rec in round_["workers"]:
        if rec["rank"] < num_workers:
            values[rec["rank"]] = rec[key]
    return values
