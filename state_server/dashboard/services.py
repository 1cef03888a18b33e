"""Writes of the dashboard's data: a worker's ``hello`` (host, device, slow-down factor) and the
evaluator's scores.

Both need the job to exist (``init`` first) and are checked like every other call: a bad value is
rejected with a ``PolicyError`` naming the field before anything is stored.
"""
from __future__ import annotations

import re

from django.db import transaction

from coordination.models import Job
from coordination.services import JobNotFound
from esync.coordination.limits import MAX_ROUND, PolicyError, check_float, check_int

from .models import Score, WorkerInfo

MAX_TRAINING_SECONDS = 10 * 365 * 86_400.0
MAX_SLOWDOWN = 1e6       # an emulated device's slow-down factor: far beyond any useful one
# Host and device names: what a log folder name can be, without control characters (the page
# inserts them as text, never as markup).
NAME = re.compile(r"[^\x00-\x1f\x7f]{1,64}")

ERR_HELLO_RANK = "r (the worker's rank) must be an integer in [0, {num_workers})"
ERR_HOST = "host must be 1 to 64 characters, none of them a control character"
ERR_DEVICE = "device must be 1 to 64 characters, none of them a control character"
ERR_SLOWDOWN = f"slowdown must be a number in [1, {MAX_SLOWDOWN:g}]"
ERR_SCORE_ROUND = f"round must be an integer in [0, {MAX_ROUND}]"
ERR_SCORE_TIME = "time (training seconds) must be a number >= 0"
ERR_ACCURACY = "accuracy must be a number in [0, 1]"


def _job(name: str) -> Job:
    job = Job.objects.filter(name=name).first()
    if job is None:
        raise JobNotFound(name)
    return job


def _name(value: str, message: str, field: str) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise PolicyError(message, field)
    return value


def worker_hello(*, job: str, rank: int, host: str, device: str,
                 slowdown: float | None = None) -> dict:
    """Remember where worker ``rank`` of ``job`` runs and how slow its device is now.

    Called by each worker at start and again whenever its emulated slow-down factor changes
    (``--speed-schedule``), so the page shows the change live. No ``slowdown`` (an older worker)
    means "unknown": the latest hello wins, so a hello without one clears an earlier factor.
    """
    row = _job(job)
    rank = check_int(rank, low=0, high=row.num_workers - 1, field="r",
                     message=ERR_HELLO_RANK.format(num_workers=row.num_workers))
    host = _name(host, ERR_HOST, "host")
    device = _name(device, ERR_DEVICE, "device")
    if slowdown is not None:
        slowdown = check_float(slowdown, low=1.0, high=MAX_SLOWDOWN, message=ERR_SLOWDOWN,
                               field="slowdown")
    WorkerInfo.objects.update_or_create(job=row, rank=rank, defaults={
        "host": host, "device": device, "slowdown": slowdown})
    return {"job": job, "r": rank, "host": host, "device": device, "slowdown": slowdown}


def score_record(*, job: str, round: int, time: float, accuracy: float) -> dict:
    """Store the test accuracy of the checkpoint of ``round`` in the job's current run."""
    round = check_int(round, low=0, high=MAX_ROUND, message=ERR_SCORE_ROUND, field="round")
    time = check_float(time, low=0.0, high=MAX_TRAINING_SECONDS, message=ERR_SCORE_TIME,
                       field="time")
    accuracy = check_float(accuracy, low=0.0, high=1.0, message=ERR_ACCURACY, field="accuracy")
    with transaction.atomic():
        row = _job(job)
        Score.objects.update_or_create(job=row, run=row.run, round=round,
                                       defaults={"time": time, "accuracy": accuracy})
    return {"job": job, "run": row.run, "round": round}
