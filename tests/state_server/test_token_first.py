"""The token is checked before the body is parsed: a call that changes state with a wrong or
missing token gets its 403/401 whatever else its body holds (a bad field, broken JSON, too many
fields or arrays), and none of its fields is parsed; on the fast path a wrong header token is
refused without the body even being read. A right token still lets the body's own errors through.
"""
import io
import json
from urllib.parse import urlencode

import pytest
from django.core.wsgi import get_wsgi_application
from django.test import Client
from django.urls import reverse

from coordination import http
from coordination.fastpath import fast_apply
from coordination.http import (ERR_BODY_TOO_LARGE, ERR_TOKEN_MISSING, ERR_TOKEN_WRONG,
                               form_token, json_token)

pytestmark = pytest.mark.usefixtures("fresh_state")

WRONG, MISSING = (403, ERR_TOKEN_WRONG), (401, ERR_TOKEN_MISSING)
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
DEEP = "[" * 20 + "0" + "]" * 20                      # beyond MAX_JSON_CONTAINERS


@pytest.fixture
def client(token):
    return Client(headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def anonymous():
    return Client()


@pytest.fixture
def job(client):
    """Job "j" (2 workers, dynamic), as the fast path needs it in memory."""
    response = client.post(reverse("job-init", kwargs={"job": "j"}),
                           data=json.dumps({"num_workers": 2}), content_type=JSON)
    assert response.status_code == 200
    return "j"


def apply_url(job="j"):
    return reverse("job-apply", kwargs={"job": job})


# -- the Django path: a token sent as a field ------------------------------------------------------

UNAUTHENTICATED = {
    # name: (body, content type, expected status and message)
    "wrong token, field of the wrong type": (
        b'{"token": "guess", "r": "zero", "k": 1, "c": 0.1}', JSON, WRONG),
    "wrong token, arrays nested too deep": (
        b'{"token": "guess", "r": 0, "k": 1, "c": 0.1, "x": ' + DEEP.encode() + b"}", JSON,
        WRONG),
    "wrong token, broken JSON after it": (b'{"token": "guess", "r": 0, "k": }', JSON, WRONG),
    "wrong token, a non-finite number": (b'{"token": "guess", "r": 0, "k": 1, "c": Infinity}',
                                          JSON, WRONG),
    "wrong token, not UTF-8 elsewhere": (b'{"r": "\xff\xfe", "token": "guess"}', JSON, WRONG),
    "wrong token, after a deep array": (
        b'{"x": ' + DEEP.encode() + b', "token": "guess"}', JSON, WRONG),
    "wrong token last of two (as json.loads reads it)": (
        b'{"token": "%(token)s", "token": "guess", "r": "zero"}', JSON, WRONG),
    "token only inside another field": (
        b'{"x": {"token": "%(token)s"}, "r": "zero"}', JSON, MISSING),
    "no token, broken JSON": (b'{"r": 0, "k": ', JSON, MISSING),
    "no token, arrays nested 1500 deep": (
        b'{"r": ' + b"[" * 1500 + b"]" * 1500 + b"}", JSON, MISSING),
    "wrong form token, too many fields": (
        ("token=guess&" + "&".join(f"f{i}=1" for i in range(40))).encode(), FORM, WRONG),
    "wrong form token, field of the wrong type": (b"token=guess&r=zero&k=1&c=0.1", FORM, WRONG),
    "no token, multipart without boundary": (b"r=0&k=1&c=0.1", "multipart/form-data", MISSING),
}


@pytest.mark.parametrize("name", sorted(UNAUTHENTICATED))
def test_an_unauthenticated_call_is_refused_for_its_token_whatever_its_body_holds(
        anonymous, job, token, name):
    body, content_type, (status, message) = UNAUTHENTICATED[name]
    body = body.replace(b"%(token)s", token.encode())
    response = anonymous.post(apply_url(), data=body, content_type=content_type)
    assert (response.status_code, response.json()) == (status, {"error": message,
                                                                 "field": "token"})


def test_an_unauthenticated_call_has_no_field_parsed(anonymous, job, monkeypatch):
    parsed = []
    monkeypatch.setattr(http, "read_fields", lambda *args, **kwargs: parsed.append(args) or {})
    for body in (b'{"token": "guess", "r": 0, "k": 1, "c": 0.1}', b'{"r": 0, "k": 1, "c": 0.1}'):
        anonymous.post(apply_url(), data=body, content_type=JSON)
    anonymous.post(apply_url(), data=b"token=guess&r=0&k=1&c=0.1", content_type=FORM)
    assert parsed == []


@pytest.mark.parametrize("body, content_type", [
    ('{"token": "%(token)s", "r": 0, "k": 1, "c": 0.1}', JSON),
    ('{"r": 0, "k": 1, "c": 0.1, "x": [1, {"y": "]}\\""}], "tok\\u0065n": "%(token)s"}', JSON),
    ("r=0&k=1&c=0.1&%%74oken=%(token)s", FORM),
])
def test_a_right_token_in_a_field_is_found_wherever_the_top_level_holds_it(
        anonymous, job, token, body, content_type):
    response = anonymous.post(apply_url(), data=body % {"token": token},
                              content_type=content_type)
    assert response.status_code == 200, response.json()


def test_a_right_token_in_a_multipart_field_passes(anonymous, job, token):
    response = anonymous.post(apply_url(), data={"token": token, "r": 0, "k": 1, "c": 0.1})
    assert response.status_code == 200, response.json()


@pytest.mark.parametrize("body, content_type, status, field", [
    ('{"token": "%(token)s", "r": 0, "k": }', JSON, 400, None),
    ('{"token": "%(token)s", "r": 0, "k": 1, "c": 0.1, "x": ' + DEEP + "}", JSON, 400, None),
    ('{"token": "%(token)s", "r": "zero", "k": 1, "c": 0.1}', JSON, 400, "r"),
    ("token=%(token)s&" + "&".join(f"f{i}=1" for i in range(40)), FORM, 400, None),
])
def test_once_the_token_is_right_the_body_s_own_errors_are_answered(
        anonymous, job, token, body, content_type, status, field):
    response = anonymous.post(apply_url(), data=body % {"token": token},
                              content_type=content_type)
    assert (response.status_code, response.json()["field"]) == (status, field)


def test_a_body_over_the_limit_without_header_token_is_refused_unread(anonymous, job):
    response = anonymous.post(apply_url(), data=json.dumps({"token": "guess", "pad": "x" * 5000}),
                              content_type=JSON)
    assert response.status_code == 413
    assert response.json()["error"] == ERR_BODY_TOO_LARGE.format(limit=4096)


def test_a_wrong_header_token_wins_over_a_right_field_token(token, job):
    intruder = Client(headers={"Authorization": "Bearer guess"})
    response = intruder.post(apply_url(), data=json.dumps({"token": token, "r": 0, "k": 1,
                                                           "c": 0.1}), content_type=JSON)
    assert response.status_code == 403


# -- the token scanners ------------------------------------------------------------------------

@pytest.mark.parametrize("body, found", [
    (b'{"token": "a"}', "a"),
    (b' {"a": [1, {"b": "]\\""}], "token" : "x", "c": -1.5e3}', "x"),
    (b'{"token": "a", "token": "b"}', "b"),
    (b'{"token": 5}', None),
    (b'{"token": "a", "token": null}', None),
    (b'{"x": {"token": "a"}}', None),
    (b'{"token": "a", "r": }', "a"),
    (b'{"r": }, "token": "a"}', None),
    (b'["token", "a"]', None),
    (b"", None),
    ('{"token": "\u00e9"}'.encode("utf-16"), "\u00e9"),
])
def test_json_token_reads_the_top_level_token_as_json_loads_would(body, found):
    assert json_token(body) == found


@pytest.mark.parametrize("body, found", [
    (b"token=abc&r=1", "abc"),
    (b"r=1&%74oken=a+b%21", "a b!"),
    (b"token=a&token=b", "b"),
    (b"token=a&token=", None),
    (b"x=1", None),
])
def test_form_token_reads_the_token_pair_as_django_would(body, found):
    assert form_token(body) == found


# -- the fast path: a token sent as a header -------------------------------------------------------

class Unread(io.BytesIO):
    """A request body that counts the reads of it."""

    def __init__(self, data):
        super().__init__(data)
        self.reads = 0

    def read(self, *args):
        self.reads += 1
        return super().read(*args)

    readline = read


def call(app, path, body: bytes, token=None, content_type=JSON):
    stream = Unread(body)
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SERVER_NAME": "testserver",
               "SERVER_PORT": "80", "wsgi.url_scheme": "http", "SERVER_PROTOCOL": "HTTP/1.1",
               "wsgi.input": stream, "CONTENT_LENGTH": str(len(body)),
               "CONTENT_TYPE": content_type, "wsgi.errors": io.StringIO()}
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    status = []
    out = b"".join(app(environ, lambda s, headers: status.append(s)))
    return int(status[0].split()[0]), json.loads(out), stream.reads


@pytest.mark.parametrize("body", [
    b'{"r": "zero", "k": 1, "c": 0.1}',
    b'{"r": 0, "k": 1, "c": 0.1, "x": ' + DEEP.encode() + b"}",
    b'{"r": 0, "k": ',
])
def test_the_fast_path_refuses_a_wrong_header_token_without_reading_the_body(job, body):
    app = fast_apply(get_wsgi_application())
    status, answer, reads = call(app, "/jobs/j/apply/", body, token="guess")
    assert (status, answer, reads) == (403, {"error": ERR_TOKEN_WRONG, "field": "token"}, 0)


def test_behind_the_fast_path_a_wrong_field_token_with_a_bad_body_is_refused_for_it(job):
    app = fast_apply(get_wsgi_application())
    body = b'{"token": "guess", "r": 0, "k": 1, "c": 0.1, "x": ' + DEEP.encode() + b"}"
    status, answer, _ = call(app, "/jobs/j/apply/", body)
    assert (status, answer) == (403, {"error": ERR_TOKEN_WRONG, "field": "token"})


def test_the_fast_path_still_answers_a_right_header_token(job, token):
    app = fast_apply(get_wsgi_application())
    status, answer, reads = call(app, "/jobs/j/apply/", b'{"r": 0, "k": 1, "c": 0.1}',
                                 token=token)
    assert (status, set(answer), reads > 0) == (200, {"ready", "budget", "wait"}, True)


def test_form_bodies_still_take_a_form_token(anonymous, token):
    response = anonymous.post(reverse("init"), data=urlencode({"num_workers": 2, "token": token}),
                              content_type=FORM)
    assert response.status_code == 200
