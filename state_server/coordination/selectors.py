"""Reads: live state of a job, its persisted round history, the list of jobs."""
from __future__ import annotations

from esync.coordination.limits import AUTO

from .models import Job, WorkerRound
from .services import JobNotFound, job_live

HISTORY_DEFAULT_LIMIT = 1000       # rounds per history answer
HISTORY_MAX_LIMIT = 100_000


def job_state(*, name: str) -> dict:
    """Every worker's k, c, ready, round as the policy sees them now."""
    return job_live(name=name).snapshot()


def job_history(*, name: str, run: int | None = None, since: int = 1,
                limit: int = HISTORY_DEFAULT_LIMIT) -> dict:
    """Closed rounds ``since`` .. ``since + limit - 1`` of a run (default: the latest run)."""
    job = Job.objects.filter(name=name).first()
    if job is None:
        raise JobNotFound(name)
    run = job.run if run is None else run
    rows = (WorkerRound.objects.filter(job=job, run=run, round__gte=since, round__lt=since + limit)
            .order_by("round", "rank").values("round", "rank", "k", "c", "compute", "wait"))
    rounds: dict[int, list[dict]] = {}
    for row in rows:
        rounds.setdefault(row.pop("round"), []).append(row)
    return {"job": job.name, "run": run, "runs": job.run, "num_workers": job.num_workers,
            "policy": job.policy,
            "epsilon": AUTO if job.epsilon == AUTO else float(job.epsilon),
            "current_round": job.current_round,
            "rounds": [{"round": number, "workers": workers} for number, workers in rounds.items()]}


def job_list() -> list[dict]:
    return list(Job.objects.order_by("name").values(
        "name", "num_workers", "policy", "epsilon", "current_round", "run"))
