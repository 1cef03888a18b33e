"""The dynamic policy's hot path: a well-formed ``/apply/`` answered without Django's request
cycle.

Under the dynamic policy every worker calls ``/apply/`` a few times per round, and each call
used to cost the server about 1.5 ms of CPU, a third of it in Django's request, URL resolver,
middleware and response machinery around a decision that takes microseconds. This WSGI wrapper
answers the one common case itself: ``POST /apply/`` or ``/jobs/<job>/apply/`` with a JSON body
within the size limit, the job's token in an ``Authorization: Bearer`` header, and a job the
server already holds in memory. It parses with the same functions and calls the same view code
(``views.apply_answer``) as Django would. Anything else (a form body, a token in a field, a
missing or wrong token, a bad field, a job to rebuild from the database, a failed commit) goes
to Django unchanged, with the body put back, so every error answer is the one documented API's;
``apply`` is idempotent, so a call handed over after it was applied counts once. The token is
checked before the body is read: a wrong one is handed over unread, and Django refuses it on its
header alone.
"""
from __future__ import annotations

import io
import json
import re

from django.conf import settings

from . import services, views
from .http import FieldError, bearer_token, check_token, json_fields
from esync.coordination.limits import PolicyError

APPLY_PATH = re.compile(r"/(?:jobs/(?P<job>[A-Za-z0-9._-]{1,64})/)?apply/?")
# What Django's SecurityMiddleware adds to every answer, so both paths answer alike.
HEADERS = [("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff"),
           ("Referrer-Policy", "same-origin"), ("Cross-Origin-Opener-Policy", "same-origin")]


def fast_apply(app):
    """Wrap the WSGI ``app`` (Django) with the ``/apply/`` hot path."""

    def application(environ, start_response):
        if environ.get("REQUEST_METHOD") == "POST":
            match = APPLY_PATH.fullmatch(environ.get("PATH_INFO", ""))
            if match is not None:
                answer = _answer(environ, match.group("job") or views.DEFAULT_JOB)
                if answer is not None:
                    body = json.dumps(answer).encode()
                    start_response("200 OK", HEADERS + [("Content-Length", str(len(body)))])
                    return [body]
        return app(environ, start_response)

    return application


def _answer(environ, job: str) -> dict | None:
    """The answer, or None to hand the request to Django (its body restored)."""
    if environ.get("CONTENT_TYPE", "").split(";")[0].strip() != "application/json":
        return None
    token = bearer_token(environ)
    if token is None:
        return None
    try:
        check_token(token)                            # before the body is read
    except FieldError:
        return None
    if services.registry.get(job) is None:
        return None
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    if not 0 < length <= settings.ESYNC_STATE_MAX_BODY:
        return None
    body = environ["wsgi.input"].read(length)
    environ["wsgi.input"] = io.BytesIO(body)          # Django reads it again if we hand over
    try:
        fields = json_fields(body)
        if "token" in fields:
            return None
        return views.apply_answer(fields, job)
    except (FieldError, PolicyError, services.JobNotFound, services.PersistError):
        return None
