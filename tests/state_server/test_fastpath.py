"""coordination.fastpath: the common /apply/ answered without Django's request cycle, and
every other request handed to Django with its body intact (so its answer is the documented one).
The inner application is the real Django one; a counter only records which path answered."""
import io
import json

import pytest
from django.core.wsgi import get_wsgi_application

from coordination import services
from coordination.fastpath import fast_apply

pytestmark = pytest.mark.usefixtures("fresh_state")


class CountingDjango:
    def __init__(self):
        self.app, self.calls = get_wsgi_application(), 0

    def __call__(self, environ, start_response):
        self.calls += 1
        return self.app(environ, start_response)


@pytest.fixture
def server():
    django = CountingDjango()
    return fast_apply(django), django


def call(app, path, body, *, token=None, content_type="application/json", method="POST"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "SERVER_NAME": "testserver",
               "SERVER_PORT": "80", "wsgi.url_scheme": "http", "SERVER_PROTOCOL": "HTTP/1.1",
               "wsgi.input": io.BytesIO(data), "CONTENT_LENGTH": str(len(data)),
               "CONTENT_TYPE": content_type, "wsgi.errors": io.StringIO()}
    if token:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    status = []
    body_out = b"".join(app(environ, lambda s, headers: status.append((s, dict(headers)))))
    return int(status[0][0].split()[0]), status[0][1], json.loads(body_out)


def init(app, token, job="f", policy="dynamic"):
    code, _, _ = call(app, f"/jobs/{job}/init/", {"num_workers": 2, "epsilon": 0,
                                                  "policy": policy}, token=token)
    assert code == 200


def test_a_well_formed_apply_never_reaches_django(server, token):
    app, django = server
    init(app, token)
    before = django.calls
    for rank, c in ((0, 0.01), (1, 0.2)):
        call(app, "/jobs/f/apply/", {"r": rank, "k": 1, "c": c, "t": 1}, token=token)
    code, headers, answer = call(app, "/jobs/f/apply/", {"r": 0, "k": 0, "c": 0.01, "t": 2},
                                 token=token)
    assert (code, answer["ready"], django.calls - before) == (200, 0, 0)
    assert 0.15 < answer["budget"] <= 0.2
    assert headers["Content-Type"] == "application/json"


def test_the_default_jobs_path_takes_the_fast_path_too(server, token):
    app, django = server
    init(app, token, job="default")
    before = django.calls
    code, _, answer = call(app, "/apply", {"r": 1, "k": 1, "c": 0.2}, token=token)
    assert (code, answer["ready"], django.calls - before) == (200, 0, 0)    # rank 0 untimed


@pytest.mark.parametrize("case, status, field", [
    ("wrong token", 403, "token"),
    ("no token", 401, "token"),
    ("missing field", 400, "c"),
    ("rank out of range", 400, "r"),
    ("unknown job", 404, None),
    ("planned job", 409, "policy"),
    ("form body", 200, None),
    ("token in a field", 200, None),
    ("body too large", 413, None),
    ("nested too deep", 400, None),
])
def test_everything_else_is_django_s_answer(server, token, case, status, field):
    app, django = server
    init(app, token)
    init(app, token, job="p", policy="planned")
    job, body, kwargs = "f", {"r": 0, "k": 1, "c": 0.01}, {"token": token}
    if case == "wrong token":
        kwargs["token"] = "nope"
    elif case == "no token":
        kwargs.pop("token")
    elif case == "missing field":
        body.pop("c")
    elif case == "rank out of range":
        body["r"] = 7
    elif case == "unknown job":
        job = "ghost"
    elif case == "planned job":
        job = "p"
    elif case == "form body":
        body, kwargs["content_type"] = b"r=0&k=1&c=0.01", "application/x-www-form-urlencoded"
    elif case == "token in a field":
        kwargs.pop("token")
        body["token"] = token
    elif case == "body too large":
        body["pad"] = "x" * 5000
    elif case == "nested too deep":
        body["deep"] = [[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]
    before = django.calls
    code, _, answer = call(app, f"/jobs/{job}/apply/", body, **kwargs)
    assert (code, django.calls - before) == (status, 1), answer
    if field:
        assert answer["field"] == field


def test_a_job_only_in_the_database_is_rebuilt_by_django(server, token):
    app, django = server
    init(app, token)
    services.registry.clear()                           # as after a restart
    before = django.calls
    code, _, answer = call(app, "/jobs/f/apply/", {"r": 0, "k": 1, "c": 0.01}, token=token)
    assert (code, set(answer), django.calls - before) == (200, {"ready", "budget", "wait"}, 1)
    before = django.calls
    call(app, "/jobs/f/apply/", {"r": 0, "k": 2, "c": 0.01}, token=token)
    assert django.calls == before                       # in memory again: fast
