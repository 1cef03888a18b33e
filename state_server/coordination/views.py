"""The API endpoints: parse, validate, call a service or selector, serialise (see http.api).

The original ESync paths (``/``, ``/init/``, ``/apply/``, ``/reset/``) act on the job "default";
``/jobs/<job>/...`` on named jobs. Field names are the original's: ``r`` rank, ``k`` local
iterations done this round, ``c`` duration of the last local iteration (s), ``t`` round entered,
``te`` the worker's timestamp (accepted, ignored: worker clocks are never trusted). ``t`` is
optional on ``apply`` and ``plan`` (the original client does not send it); with it, a retried
call of an older round changes nothing. ``rounds`` is the one-call-per-round report of rank 0.
"""
from django.http import JsonResponse

from esync.coordination.limits import MAX_BATCH
from esync.coordination.rules import RoundSizing

from . import selectors, services
from .http import (ERR_NOT_FOUND, ERR_SERVER, FieldError, api, bool_field, epsilon_field,
                   error_response, float_field, int_field, list_field, text_field)
from .selectors import HISTORY_DEFAULT_LIMIT, HISTORY_MAX_LIMIT

DEFAULT_JOB = "default"
ERR_RUN = "run must be an integer >= 1"
ERR_KEY = "key (the client's id of this init, to make a retry harmless) must be 1 to 64 characters"
ERR_BAD_REQUEST = "bad request: {detail}"
ERR_BATCH_ITEM = ("each item of rounds must be an object {\"t\": t, \"k\": [...], \"c\": [...]} "
                  "(optionally \"d\": [...])")
HINT_NO_DEFAULT_JOB = ("the job 'default' has not been initialised yet: POST /init/ creates it; "
                       "named jobs live at /jobs/<job>/")
ERR_FORBIDDEN = "forbidden"


def _ignore_worker_timestamp(fields: dict) -> None:
    float_field(fields, "te", required=False)       # validated for type only, never used


@api("POST", changes_state=True)
def init(request, fields, job=DEFAULT_JOB):
    key = text_field(fields, "key", default="")
    if len(key) > 64:
        raise FieldError(ERR_KEY, "key")
    return services.job_init(name=job, num_workers=int_field(fields, "num_workers"),
                             epsilon=epsilon_field(fields),
                             policy=text_field(fields, "policy", default="dynamic"), key=key,
                             sizing=RoundSizing(
                                 comm_share=float_field(fields, "comm_share", default=1.0,
                                                        required=False),
                                 max_round=float_field(fields, "max_round", default=0.0,
                                                       required=False),
                                 overlap=bool_field(fields, "overlap", default=False),
                                 sit_out=float_field(fields, "sit_out", default=0.0,
                                                     required=False)))


@api("POST", changes_state=True)
def apply(request, fields, job=DEFAULT_JOB):
    return apply_answer(fields, job)


def apply_answer(fields: dict, job: str) -> dict:
    """The ``apply`` view's work on parsed, authenticated fields (``coordination.fastpath``
    calls it too)."""
    rank, k, c = int_field(fields, "r"), int_field(fields, "k"), float_field(fields, "c")
    t = int_field(fields, "t", required=False)
    d = float_field(fields, "d", required=False)
    _ignore_worker_timestamp(fields)
    decision = services.worker_apply(job=job, rank=rank, k=k, c=c, t=t, d=d)
    return {"ready": int(decision.ready), "budget": round(decision.budget, 6),
            "wait": round(decision.wait, 6), **({"sit_out": 1} if decision.sit_out else {})}


@api("POST", changes_state=True)
def plan(request, fields, job=DEFAULT_JOB):
    rank, c = int_field(fields, "r"), float_field(fields, "c")
    t = int_field(fields, "t", required=False)
    d = float_field(fields, "d", required=False)
    _ignore_worker_timestamp(fields)
    return {"k": services.worker_plan(job=job, rank=rank, c=c, t=t, d=d)}


@api("POST", changes_state=True)
def reset(request, fields, job=DEFAULT_JOB):
    rank, round_ = int_field(fields, "r"), int_field(fields, "t")
    _ignore_worker_timestamp(fields)
    return services.worker_enter_round(job=job, rank=rank, round=round_)


@api("POST", changes_state=True, max_body="ESYNC_STATE_MAX_ROUNDS_BODY",
     max_containers=4 + 5 * MAX_BATCH)
def rounds(request, fields, job=DEFAULT_JOB):
    """Rank 0's report of round t: every worker's k and c; answers the plan of every worker.

    ``{"rounds": [{"t", "k", "c"}, ...]}`` reports several rounds in order in one call (a
    reporter that fell behind catches up in one transaction); the answer is the last round's.
    """
    if "rounds" in fields:
        batch = []
        for item in list_field(fields, "rounds"):
            if not isinstance(item, dict):
                raise FieldError(ERR_BATCH_ITEM, "rounds")
            batch.append(_round_report(item))
        return services.job_report_rounds(job=job, reports=batch)
    return services.job_report_rounds(job=job, reports=[_round_report(fields)])


def _round_report(fields: dict) -> tuple:
    """``(t, k, c, d, o)`` of one round; ``d`` (every worker's communication time) and ``o``
    (every worker's aggregation overhead) are optional."""
    d = list_field(fields, "d") if fields.get("d") is not None else None
    o = list_field(fields, "o") if fields.get("o") is not None else None
    return int_field(fields, "t"), list_field(fields, "k"), list_field(fields, "c"), d, o


@api("GET", changes_state=False)
def state(request, fields, job=DEFAULT_JOB):
    return selectors.job_state(name=job)


@api("GET", changes_state=False)
def home(request, fields):
    """``GET /``: the original's view of the job "default"; before its init, the list of jobs."""
    try:
        return selectors.job_state(name=DEFAULT_JOB)
    except services.JobNotFound:
        return {"job": DEFAULT_JOB, "initialised": False, "hint": HINT_NO_DEFAULT_JOB,
                "jobs": selectors.job_list()}


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


def bad_request(request, exception=None):
    detail = str(exception) if exception is not None else ""
    detail = detail.encode("ascii", "backslashreplace").decode("ascii")[:200] or "malformed"
    return error_response(ERR_BAD_REQUEST.format(detail=detail), None, 400)


def forbidden(request, exception=None):
    return error_response(ERR_FORBIDDEN, None, 403)


def not_found(request, exception=None):
    return error_response(ERR_NOT_FOUND.format(path=request.path), None, 404)


def server_error(request):
    return JsonResponse({"error": ERR_SERVER, "field": None}, status=500)
