"""Writes: create jobs, record decisions and closed rounds. Views call these; they call esync.policy.

The live state of every job is an ``esync.policy.JobState`` held in this process (one gunicorn
process, many threads); the database keeps what a restart needs (``Job``) and the round history
(``WorkerRound``). The first call for a job that is in the database but not in memory (after a
restart) rebuilds it from its row: worker count, slack, policy and current round.
"""
from __future__ import annotations

from django.db import transaction

from esync.policy import AUTO, JobRegistry, JobState

from .models import Job, WorkerRound

ERR_UNKNOWN_JOB = "unknown job {job!r}: call init first"

registry = JobRegistry()


class JobNotFound(Exception):
    def __init__(self, job: str):
        super().__init__(ERR_UNKNOWN_JOB.format(job=job))
        self.message = str(self)
        self.field = "job"


def _epsilon_to_db(epsilon: float | str) -> str:
    return AUTO if epsilon == AUTO else repr(float(epsilon))


def _epsilon_from_db(text: str) -> float | str:
    return AUTO if text == AUTO else float(text)


def job_init(*, name: str, num_workers: int, epsilon: float | str, policy: str) -> dict:
    """Create job ``name`` or start a new run of it: round 1, no worker state, empty history."""
    live = JobState(name=name, num_workers=num_workers, epsilon=epsilon, policy=policy)
    with transaction.atomic():
        job, created = Job.objects.get_or_create(name=name, defaults={
            "num_workers": live.num_workers, "epsilon": _epsilon_to_db(live.epsilon),
            "policy": live.policy, "current_round": 1, "run": 1})
        if not created:
            job.num_workers, job.policy = live.num_workers, live.policy
            job.epsilon = _epsilon_to_db(live.epsilon)
            job.current_round, job.run = 1, job.run + 1
            job.save()
    registry.put(live)
    return {"job": name, "run": job.run, "num_workers": live.num_workers,
            "epsilon": live.epsilon, "policy": live.policy, "round": live.current_round}


def job_live(*, name: str) -> JobState:
    """The in-memory state of job ``name``, rebuilt from the database after a restart."""
    live = registry.get(name)
    if live is not None:
        return live
    row = Job.objects.filter(name=name).first()
    if row is None:
        raise JobNotFound(name)
    rebuilt = JobState(name=name, num_workers=row.num_workers,
                       epsilon=_epsilon_from_db(row.epsilon), policy=row.policy,
                       current_round=row.current_round)
    return registry.setdefault(rebuilt)


def worker_apply(*, job: str, rank: int, k: int, c: float) -> bool:
    """Dynamic policy: is the worker ready to aggregate? (memory only: the hot path)"""
    return job_live(name=job).apply(rank, k, c)


def worker_plan(*, job: str, rank: int, c: float) -> int:
    """Planned policy: local iterations for this worker this round."""
    return job_live(name=job).plan(rank, c)


def worker_enter_round(*, job: str, rank: int, round: int) -> dict:
    """The worker entered ``round``: update the live state, persist its closed round."""
    entry = job_live(name=job).enter_round(rank, round)
    if entry.record is not None or entry.new_round:
        with transaction.atomic():
            row = Job.objects.filter(name=job).only("id", "run").first()
            if row is not None:
                if entry.new_round:
                    Job.objects.filter(pk=row.pk, current_round__lt=entry.current_round).update(
                        current_round=entry.current_round)
                if entry.record is not None:
                    record = entry.record
                    WorkerRound.objects.update_or_create(
                        job=row, run=row.run, round=record.round, rank=record.rank,
                        defaults={"k": record.k, "c": record.c, "compute": record.compute,
                                  "wait": record.wait})
    return {"round": entry.current_round}
