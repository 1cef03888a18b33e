"""The API endpoints: parse, validate, call a service or selector, serialise (see http.api).

The original ESync paths (``/``, ``/init/``, ``/apply/``, ``/reset/``) act on the job "default";
``/jobs/<job>/...`` on named jobs. Field names are the original's: ``r`` rank, ``k`` local
iterations done this round, ``c`` duration of the last local iteration (s), ``t`` round entered,
``te`` the worker's timestamp (accepted, ignored: worker clocks are never trusted).
"""
from django.http import JsonResponse

from . import selectors, services
from .http import (ERR_NOT_FOUND, ERR_SERVER, FieldError, api, epsilon_field, error_response,
                   float_field, int_field, text_field)
from .selectors import HISTORY_DEFAULT_LIMIT, HISTORY_MAX_LIMIT

DEFAULT_JOB = "default"
ERR_RUN = "run must be an integer >= 1"


def _ignore_worker_timestamp(fields: dict) -> None:
    float_field(fields, "te", required=False)       # validated for type only, never used


@api("POST", changes_state=True)
def init(request, fields, job=DEFAULT_JOB):
    return services.job_init(name=job, num_workers=int_field(fields, "num_workers"),
                             epsilon=epsilon_field(fields),
                             policy=text_field(fields, "policy", default="dynamic"))


@api("POST", changes_state=True)
def apply(request, fields, job=DEFAULT_JOB):
    rank, k, c = int_field(fields, "r"), int_field(fields, "k"), float_field(fields, "c")
    _ignore_worker_timestamp(fields)
    ready = services.worker_apply(job=job, rank=rank, k=k, c=c)
    return {"ready": int(ready)}


@api("POST", changes_state=True)
def plan(request, fields, job=DEFAULT_JOB):
    rank, c = int_field(fields, "r"), float_field(fields, "c")
    _ignore_worker_timestamp(fields)
    return {"k": services.worker_plan(job=job, rank=rank, c=c)}


@api("POST", changes_state=True)
def reset(request, fields, job=DEFAULT_JOB):
    rank, round_ = int_field(fields, "r"), int_field(fields, "t")
    _ignore_worker_timestamp(fields)
    return services.worker_enter_round(job=job, rank=rank, round=round_)


@api("GET", changes_state=False)
def state(request, fields, job=DEFAULT_JOB):
    return selectors.job_state(name=job)


@api("GET", changes_state=False)
def history(request, fields, job=DEFAULT_JOB):
    run = int_field(fields, "run", required=False)
    if run is not None and run < 1:
        raise FieldError(ERR_RUN, "run")
    since = int_field(fields, "since", default=1, required=False)
    limit = int_field(fields, "limit", default=HISTORY_DEFAULT_LIMIT, required=False)
    limit = max(1, min(limit, HISTORY_MAX_LIMIT))
    return selectors.job_history(name=job, run=run, since=since, limit=limit)


@api("GET", changes_state=False)
def jobs(request, fields):
    return {"jobs": selectors.job_list()}


@api("GET", changes_state=False)
def health(request, fields):
    return {"status": "ok"}


def not_found(request, exception=None):
    return error_response(ERR_NOT_FOUND.format(path=request.path), None, 404)


def server_error(request):
    return JsonResponse({"error": ERR_SERVER, "field": None}, status=500)
