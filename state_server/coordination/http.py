"""HTTP plumbing of the API: body parsing (form or JSON), typed fields, the token, JSON errors.

Views are wrapped by ``api``: it checks the method, the job name, the declared body size and a
token sent as a header (all cheap) before reading the body; then it parses the body (JSON bodies
with at most ``MAX_JSON_CONTAINERS`` arrays or objects, so nesting never reaches the parser's
recursion limit), checks a token sent as a field, hands the view its fields, turns a returned
dict into JSON and every rejected input into ``{"error": "...", "field": "..."}`` with a 4xx
status, before any state is touched. Whatever Django raises while reading the request (too many
fields, a multipart body without boundary, an unknown or non-UTF-8 charset) is a 400 too.
"""
from __future__ import annotations

import functools
import hmac
import json
import re

from django.conf import settings
from django.core.exceptions import BadRequest, RequestDataTooBig, SuspiciousOperation
from django.http import JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.views.decorators.csrf import csrf_exempt

from esync.coordination.limits import AUTO, PolicyError, PolicyMismatch

from .services import JobNotFound, PersistError

ERR_BODY_TOO_LARGE = "request body is larger than {limit} bytes"
ERR_BODY_NOT_JSON = "body is not a JSON object: {detail}"
ERR_BODY_UNREADABLE = "body could not be parsed: {detail}"
ERR_BODY_NESTED = ("JSON body has more than {limit} arrays or objects; this API takes a flat "
                   "object of numbers, texts and lists of numbers")
ERR_QUERY_UNREADABLE = "query string could not be parsed: {detail}"
ERR_NOT_LIST = "field {field!r} must be a JSON list, got {value}"
ERR_MISSING = "missing field {field!r}"
ERR_NOT_INTEGER = "field {field!r} must be an integer, got {value}"
ERR_NOT_NUMBER = "field {field!r} must be a number, got {value}"
ERR_NOT_TEXT = "field {field!r} must be text, got {value}"
ERR_TOKEN_MISSING = ("this call changes state and needs the job token: send the header "
                     "'Authorization: Bearer <token>' or a field 'token'")
ERR_TOKEN_WRONG = "wrong token"
ERR_METHOD = "method {method} not allowed here; use {allowed}"
ERR_JOB_NAME = "job names are 1 to 64 letters, digits, '.', '_' or '-'"
ERR_NOT_FOUND = "no such endpoint: {path}"
ERR_SERVER = "internal error of the state server"

JOB_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_JSON_CONTAINERS = 16
# Whatever Django's request parsing raises on a malformed request: the client's fault (400).
REQUEST_PARSE_ERRORS = (SuspiciousOperation, BadRequest, MultiPartParserError, UnicodeError,
                        LookupError, ValueError, TypeError)


class FieldError(Exception):
    """A rejected request: message, offending field, HTTP status."""

    def __init__(self, message: str, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.field, self.status = message, field, status


def error_response(message: str, field: str | None = None, status: int = 400) -> JsonResponse:
    return JsonResponse({"error": message, "field": field}, status=status)


def read_fields(request, limit: int | None = None,
                max_containers: int = MAX_JSON_CONTAINERS) -> dict:
    """The request's fields: query string for GET, else a JSON object or a form body.

    The declared size is checked before anything is read; at most ``limit`` bytes are parsed.
    """
    if request.method == "GET":
        try:
            return {key: request.GET.get(key) for key in request.GET}
        except REQUEST_PARSE_ERRORS as exc:
            raise FieldError(ERR_QUERY_UNREADABLE.format(detail=_detail(exc))) from None
    limit = settings.ESYNC_STATE_MAX_BODY if limit is None else limit
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise FieldError(ERR_BODY_TOO_LARGE.format(limit=limit), None, 413)
    try:
        body = request.body
        if len(body) > limit:
            raise FieldError(ERR_BODY_TOO_LARGE.format(limit=limit), None, 413)
        if request.content_type == "application/json" or body.lstrip()[:1] == b"{":
            return json_fields(body, max_containers)
        return {key: request.POST.get(key) for key in request.POST}
    except RequestDataTooBig:
        raise FieldError(ERR_BODY_TOO_LARGE.format(limit=limit), None, 413) from None
    except REQUEST_PARSE_ERRORS as exc:
        raise FieldError(ERR_BODY_UNREADABLE.format(detail=_detail(exc))) from None


def _detail(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return _short(text.encode("ascii", "backslashreplace").decode("ascii"), 120)


def json_fields(body: bytes, max_containers: int = MAX_JSON_CONTAINERS) -> dict:
    if body.count(b"[") + body.count(b"{") > max_containers:
        raise FieldError(ERR_BODY_NESTED.format(limit=max_containers))
    try:
        data = json.loads(body or b"{}")
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FieldError(ERR_BODY_NOT_JSON.format(detail=_detail(exc))) from None
    if not isinstance(data, dict):
        raise FieldError(ERR_BODY_NOT_JSON.format(detail=type(data).__name__))
    return data


def _get(fields: dict, name: str, required: bool):
    """The raw value, or None when absent and optional."""
    value = fields.get(name)
    if value is None or value == "":
        if required:
            raise FieldError(ERR_MISSING.format(field=name), name)
        return None
    return value


def int_field(fields: dict, name: str, *, default: int | None = None, required: bool = True) -> int:
    """An integer from a form string or a JSON number (ranges are the policy's business)."""
    value = _get(fields, name, required)
    if value is None:
        return default
    if isinstance(value, bool):
        raise FieldError(ERR_NOT_INTEGER.format(field=name, value=_short(value)), name)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d{1,30}\s*", value):
        return int(value)
    raise FieldError(ERR_NOT_INTEGER.format(field=name, value=_short(value)), name)


def float_field(fields: dict, name: str, *, default: float | None = None,
                required: bool = True) -> float:
    """A number from a form string or a JSON number (finiteness and range: the policy's)."""
    value = _get(fields, name, required)
    if value is None:
        return default
    if isinstance(value, bool):
        raise FieldError(ERR_NOT_NUMBER.format(field=name, value=_short(value)), name)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:                              # a JSON integer beyond any float
            raise FieldError(ERR_NOT_NUMBER.format(field=name, value=_short(value)),
                             name) from None
    if isinstance(value, str) and len(value) <= 64:
        try:
            return float(value)
        except ValueError:
            pass
    raise FieldError(ERR_NOT_NUMBER.format(field=name, value=_short(value)), name)


def list_field(fields: dict, name: str) -> list:
    """A JSON list (its items are the policy's business); form bodies cannot carry one."""
    value = _get(fields, name, required=True)
    if not isinstance(value, list):
        raise FieldError(ERR_NOT_LIST.format(field=name, value=_short(value)), name)
    return value


def text_field(fields: dict, name: str, *, default: str) -> str:
    value = _get(fields, name, required=False)
    if value is None:
        return default
    if not isinstance(value, str):
        raise FieldError(ERR_NOT_TEXT.format(field=name, value=_short(value)), name)
    return value.strip()


def epsilon_field(fields: dict) -> float | str:
    """``"auto"`` (default) or absolute seconds, as the original's ``epsilon``."""
    value = fields.get("epsilon")
    if value is None or value == "" or (isinstance(value, str) and value.strip() == AUTO):
        return AUTO
    return float_field(fields, "epsilon")


def _short(value, limit: int = 40) -> str:
    text = value if isinstance(value, str) and limit > 40 else repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > limit:
        return f"an integer of {len(text)} digits"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def header_token(request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    return bearer_token(request.META)


def bearer_token(meta: dict) -> str | None:
    """``header_token`` of a WSGI environ (Django's ``request.META`` is one)."""
    header = meta.get("HTTP_AUTHORIZATION", "")
    given = header[7:].strip() if header[:7].lower() == "bearer " else ""
    return given or None


def field_token(fields: dict) -> str | None:
    value = fields.get("token")
    return value if isinstance(value, str) and value else None


def check_token(given: str | None) -> None:
    """401 without a token (unless anonymous calls are allowed), 403 with a wrong one."""
    if given is None:
        if settings.ESYNC_STATE_ALLOW_ANONYMOUS:
            return
        raise FieldError(ERR_TOKEN_MISSING, "token", 401)
    try:
        given_bytes = given.encode()
    except UnicodeEncodeError:                       # e.g. a lone surrogate from a JSON field
        raise FieldError(ERR_TOKEN_WRONG, "token", 403) from None
    if not hmac.compare_digest(given_bytes, settings.ESYNC_STATE_TOKEN.encode()):
        raise FieldError(ERR_TOKEN_WRONG, "token", 403)


def api(method: str, *, changes_state: bool, max_body: str = "ESYNC_STATE_MAX_BODY",
        max_containers: int = MAX_JSON_CONTAINERS):
    """Wrap a view ``view(request, fields, job=...) -> dict`` into a JSON API endpoint.

    ``max_body`` names the setting that limits the body of this endpoint; ``max_containers``
    bounds the arrays and objects of a JSON body (and so its nesting).
    """

    def decorate(view):
        @csrf_exempt
        @functools.wraps(view)
        def endpoint(request, **kwargs):
            try:
                if request.method != method and (method, request.method) != ("GET", "HEAD"):
                    raise FieldError(ERR_METHOD.format(method=request.method, allowed=method),
                                     None, 405)
                job = kwargs.get("job")
                if job is not None and not JOB_NAME.fullmatch(job):
                    raise FieldError(ERR_JOB_NAME, "job")
                from_header = header_token(request)
                if changes_state and from_header is not None:
                    check_token(from_header)              # before the body is even read
                fields = read_fields(request, getattr(settings, max_body), max_containers)
                if changes_state and from_header is None:
                    check_token(field_token(fields))
                return JsonResponse(view(request, fields, **kwargs), safe=False)
            except FieldError as exc:
                response = error_response(exc.message, exc.field, exc.status)
                if exc.status == 405:
                    response["Allow"] = method
                return response
            except PolicyMismatch as exc:
                return error_response(exc.message, exc.field, 409)
            except PolicyError as exc:
                return error_response(exc.message, exc.field, 400)
            except JobNotFound as exc:
                return error_response(exc.message, exc.field, 404)
            except PersistError as exc:
                return error_response(exc.message, exc.field, 503)

        return endpoint

    return decorate


def json_error_guard(app):
    """Wrap the WSGI ``app``: what escapes Django (it builds the request, e.g. its query string
    and charset, before any handler or middleware runs) is answered as a JSON 400 or 500."""
    import logging
    log = logging.getLogger("django.request")

    def guarded(environ, start_response):
        try:
            return app(environ, start_response)
        except REQUEST_PARSE_ERRORS as exc:
            status, body = "400 Bad Request", {"error": ERR_BODY_UNREADABLE.format(
                detail=_detail(exc)).replace("body", "request", 1), "field": None}
        except Exception:
            log.exception("state server: error outside Django's handler")
            status, body = "500 Internal Server Error", {"error": ERR_SERVER, "field": None}
        data = b"" if environ.get("REQUEST_METHOD") == "HEAD" else json.dumps(body).encode()
        start_response(status, [("Content-Type", "application/json"),
                                ("Content-Length", str(len(data)))])
        return [data]

    return guarded


class HeadWithoutBody:
    """Django middleware: a HEAD answer keeps its headers and drops its body (RFC 9110)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.method == "HEAD" and not response.streaming:
            response["Content-Length"] = str(len(response.content))
            response.content = b""
        return response
