"""HTTP plumbing of the API: body parsing (form or JSON), typed fields, the token, JSON errors.

Views are wrapped by ``api``: it checks the method, the job name and, for a call that changes
state, the token before anything of the body is parsed, so an unauthenticated request gets its
401/403 whatever its body holds. A token sent as a header is checked before the body is even
read. Without one, the declared size is checked, the body read (at most the limit) and only its
token looked for (``body_token``): a JSON body is scanned once at its top level without building
any value but the token's, a form body's pairs are split without decoding any value but the
token's; only a multipart body must go through Django's parser for it. Then ``api`` parses the
body into fields (JSON bodies with at most ``MAX_JSON_CONTAINERS`` arrays or objects, so nesting
never reaches the parser's recursion limit), hands the view its fields, turns a returned dict into
JSON and every rejected input into ``{"error": "...", "field": "..."}`` with a 4xx status, before
any state is touched. Whatever Django raises while reading the request (too many fields, a
multipart body without boundary, an unknown or non-UTF-8 charset) is a 400 too.
"""
from __future__ import annotations

import functools
import hmac
import json
import re
from io import BytesIO
from json.decoder import scanstring
from urllib.parse import unquote

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
    body = read_body(request, limit)
    try:
        if is_json(request, body):
            return json_fields(body, max_containers)
        return {key: request.POST.get(key) for key in request.POST}
    except RequestDataTooBig:
        raise FieldError(ERR_BODY_TOO_LARGE.format(limit=limit), None, 413) from None
    except REQUEST_PARSE_ERRORS as exc:
        raise FieldError(ERR_BODY_UNREADABLE.format(detail=_detail(exc))) from None


def read_body(request, limit: int) -> bytes:
    """The raw body: 413 when its declared size exceeds ``limit`` (nothing is read then) or when
    what arrives does."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise FieldError(ERR_BODY_TOO_LARGE.format(limit=limit), None, 413)
    try:
        body = request.body
    except RequestDataTooBig:
        raise FieldError(ERR_BODY_TOO_LARGE.format(limit=limit), None, 413) from None
    except REQUEST_PARSE_ERRORS as exc:
        raise FieldError(ERR_BODY_UNREADABLE.format(detail=_detail(exc))) from None
    if len(body) > limit:
        raise FieldError(ERR_BODY_TOO_LARGE.format(limit=limit), None, 413)
    return body


def is_json(request, body: bytes) -> bool:
    """Whether the body is read as JSON (declared so, or looking like an object)."""
    return request.content_type == "application/json" or body.lstrip()[:1] == b"{"


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


ERR_NOT_BOOL = "{field} must be true or false (JSON) or 0/1, true/false (form), got {value}"


def bool_field(fields: dict, name: str, *, default: bool) -> bool:
    """A JSON boolean, or a form's ``0``/``1``/``true``/``false``."""
    value = _get(fields, name, required=False)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false"):
        return value.strip().lower() in ("1", "true")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise FieldError(ERR_NOT_BOOL.format(field=name, value=_short(value)), name)


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


def body_token(request, limit: int) -> str | None:
    """The ``token`` field of a request that sent no header token, found with the least work:
    nothing else of the body is parsed or validated, so that a wrong or missing token is
    answered as such whatever the other fields hold. None when there is none, or when the body
    is too broken to find it (a call that cannot show its token is unauthenticated)."""
    if request.method in ("GET", "HEAD"):
        return form_token(request.META.get("QUERY_STRING", "").encode("iso-8859-1", "replace"))
    body = read_body(request, limit)
    if is_json(request, body):
        return json_token(body)
    if request.content_type == "application/x-www-form-urlencoded":
        return form_token(body)
    if request.content_type == "multipart/form-data":
        # Parts need the multipart parser; a copy of the body, so that a failure here leaves
        # the request to be parsed (and its error reported) as usual once the token is right.
        try:
            fields, _ = request.parse_file_upload(request.META, BytesIO(body))
            return field_token(fields)
        except REQUEST_PARSE_ERRORS:
            return None
    return None


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_JSON_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|NaN|"
                          r"-?Infinity")
_JSON_STRUCTURE = re.compile(r'["\[\]{}]')


def json_token(body: bytes) -> str | None:
    """The ``token`` member of a JSON object body, as ``json.loads`` would give it (the last of
    repeated keys), read without building any other value: strings and containers of other
    members are skipped by a flat scan (no recursion, so depth costs nothing). A syntax error
    ends the scan with what was found before it (the full parse reports the error later)."""
    encoding = json.detect_encoding(body)
    try:
        text = body.decode(encoding, "surrogatepass")      # as json.loads decodes
    except UnicodeDecodeError:
        # Bytes that are not text elsewhere fail the full parse later; they must not hide the
        # token, and a token made of them can only be wrong (it cannot be encoded to compare).
        text = body.decode(encoding, "surrogateescape")
    token = None
    try:
        pos = _JSON_SPACE.match(text).end()
        if text[pos] != "{":
            return None
        pos = _JSON_SPACE.match(text, pos + 1).end()
        if text[pos] == "}":
            return None
        while True:
            if text[pos] != '"':
                return token
            key, pos = scanstring(text, pos + 1)
            pos = _JSON_SPACE.match(text, pos).end()
            if text[pos] != ":":
                return token
            pos = _JSON_SPACE.match(text, pos + 1).end()
            if text[pos] == '"':
                value, pos = scanstring(text, pos + 1)
                if key == "token":
                    token = value
            else:
                if key == "token":
                    token = None                     # not text: no token (as field_token)
                pos = _skip_json_value(text, pos)
            pos = _JSON_SPACE.match(text, pos).end()
            if text[pos] == "}":
                return token
            if text[pos] != ",":
                return token
            pos = _JSON_SPACE.match(text, pos + 1).end()
    except (ValueError, IndexError):
        return token


def _skip_json_value(text: str, pos: int) -> int:
    """The end of the number, literal, array or object at ``pos`` (not checked inside)."""
    if text[pos] not in "[{":
        match = _JSON_SCALAR.match(text, pos)
        if match is None:
            raise ValueError("not a JSON value")
        return match.end()
    depth = 0
    while True:
        match = _JSON_STRUCTURE.search(text, pos)
        if match is None:
            raise ValueError("unclosed array or object")
        pos = match.start()
        char = text[pos]
        if char == '"':
            pos = scanstring(text, pos + 1)[1]
            continue
        depth += 1 if char in "[{" else -1
        pos += 1
        if depth == 0:
            return pos


def form_token(body: bytes) -> str | None:
    """The ``token`` pair of a URL-encoded body, as Django's QueryDict would decode it (UTF-8,
    else Latin-1; the last of repeated keys), decoding no other value."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("iso-8859-1")
    token = None
    for pair in text.split("&"):
        name, _, value = pair.partition("=")
        if pair and unquote(name.replace("+", " "), errors="replace") == "token":
            token = unquote(value.replace("+", " "), errors="replace")
    return token or None


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
                limit = getattr(settings, max_body)
                if changes_state:                         # before any field is parsed
                    from_header = header_token(request)   # before the body is even read
                    check_token(from_header if from_header is not None
                                else body_token(request, limit))
                fields = read_fields(request, limit, max_containers)
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
