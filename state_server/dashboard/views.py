"""The dashboard page, the JSON it refreshes from, and the two calls that feed it.

Read-only parts (``/dashboard/...``) need no token and show no secret; ``hello`` and ``scores``
change state and need the job's token like every other such call (``coordination.http.api``).
"""
from pathlib import Path

from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET
from django.views.static import serve

from coordination.http import api, float_field, int_field

from . import selectors, services

STATIC_DIR = Path(__file__).resolve().parent / "static" / "dashboard"
ASSETS = {"dashboard.js", "dashboard.css"}
REFRESH_SECONDS = 2
# Everything the page uses comes from this server: a mistake cannot load anything from outside.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                           "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                           "form-action 'self'; frame-ancestors 'none'")


@require_GET
def page(request):
    jobs = selectors.job_choices()
    chosen = request.GET.get("job") or (jobs[0]["name"] if jobs else "")
    response = render(request, "dashboard/index.html", {
        "jobs": jobs, "chosen": chosen, "refresh_seconds": REFRESH_SECONDS,
        "refresh_ms": REFRESH_SECONDS * 1000})
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response["Cache-Control"] = "no-store"
    return response


@require_GET
def asset(request, name: str):
    if name not in ASSETS:
        raise Http404(name)
    response = serve(request, name, document_root=str(STATIC_DIR))
    response["Cache-Control"] = "no-cache"
    return response


@api("GET", changes_state=False)
def jobs(request, fields):
    return {"jobs": selectors.job_choices()}


@api("GET", changes_state=False)
def job(request, fields, job):
    return selectors.job_dashboard(name=job)


@api("POST", changes_state=True)
def hello(request, fields, job):
    return services.worker_hello(job=job, rank=int_field(fields, "r"),
                                 host=fields.get("host"), device=fields.get("device"),
                                 slowdown=float_field(fields, "slowdown", required=False))


@api("POST", changes_state=True)
def scores(request, fields, job):
    return services.score_record(job=job, round=int_field(fields, "round"),
                                 time=float_field(fields, "time"),
                                 accuracy=float_field(fields, "accuracy"))
