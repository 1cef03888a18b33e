"""Hostile requests against a real state server (gunicorn on loopback): every answer is a JSON
4xx, none is a 5xx, and no job changes. One test per class of input where parsing can fail."""
import http.client
import importlib.util
import json
import socket
from pathlib import Path

import pytest
import requests

from esync.coordination.service import free_port, start_state_server, stop, wait_until_up

ROOT = Path(__file__).resolve().parents[2]

TOKEN = "hostile-token-2b7e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}
MANY_QUERY_FIELDS = "&".join(f"f{i}=1" for i in range(40))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("state-hostile")
    proc = start_state_server(port=free_port(), token=TOKEN, db_path=folder / "db.sqlite3",
                              log_path=folder / "server.log")
    try:
        wait_until_up(proc.url, timeout=60, proc=proc)
        session = requests.Session()
        session.headers.update(AUTH)
        session.post(f"{proc.url}/jobs/h/init/", json={"num_workers": 2}).raise_for_status()
        session.post(f"{proc.url}/jobs/h/apply/",
                     json={"r": 1, "k": 1, "c": 0.2}).raise_for_status()
        session.post(f"{proc.url}/jobs/h/reset/", json={"r": 1, "t": 2}).raise_for_status()
        yield proc
    finally:
        stop(proc)


def job_view(url: str) -> dict:
    state = requests.get(f"{url}/jobs/h/").json()
    for worker in state["workers"]:
        worker.pop("seen_ago")
    return {"state": state, "history": requests.get(f"{url}/jobs/h/history/").json()}


def is_json_client_error(response: requests.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return 400 <= response.status_code < 500 and isinstance(body.get("error"), str)


def raw_request(url: str, payload: bytes) -> tuple[int, bytes]:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(payload)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.read()


HOSTILE = {
    # numbers
    "integer-too-large-for-a-float-in-c": ("POST", "/jobs/h/apply/", AUTH | JSON,
                                           b'{"r": 0, "k": 1, "c": 1' + b"0" * 400 + b"}"),
    "integer-too-large-for-a-float-in-te": ("POST", "/jobs/h/apply/", AUTH | JSON,
                                            b'{"r": 0, "k": 1, "c": 0.1, "te": 1' + b"0" * 400
                                            + b"}"),
    "integer-too-large-for-a-float-in-epsilon": ("POST", "/jobs/new/init/", AUTH | JSON,
                                                 b'{"num_workers": 2, "epsilon": 1' + b"0" * 400
                                                 + b"}"),
    "integer-too-large-for-a-float-in-a-round-report": (
        "POST", "/jobs/h/rounds/", AUTH | JSON, b'{"t": 1, "k": [1, 1], "c": [1' + b"0" * 400
        + b', 1]}'),
    "non-finite-json-literal": ("POST", "/jobs/h/apply/", AUTH | JSON,
                                b'{"r": 0, "k": 1, "c": Infinity}'),
    "integer-beyond-python-digit-limit": ("POST", "/jobs/h/rounds/", AUTH | JSON,
                                          b'{"t": 1' + b"0" * 5000 + b', "k": [1], "c": [1]}'),
    # nesting
    "arrays-nested-1500-deep-without-token": ("POST", "/jobs/h/apply/", JSON,
                                              b'{"r": ' + b"[" * 1500 + b"]" * 1500 + b"}"),
    "objects-nested-1000-deep": ("POST", "/jobs/h/apply/", AUTH | JSON,
                                 b'{"a": ' * 1000 + b"1" + b"}" * 1000),
    # encodings
    "lone-surrogate-token": ("POST", "/jobs/h/apply/", JSON,
                             b'{"r": 0, "k": 1, "c": 0.1, "token": "\\ud800"}'),
    "lone-surrogate-fields": ("POST", "/jobs/h/apply/", AUTH | JSON,
                              b'{"r": "\\ud800", "k": 1, "c": 0.1}'),
    "invalid-utf8-json": ("POST", "/jobs/h/apply/", AUTH | JSON, b'{"r": "\xff\xfe"}'),
    "multipart-without-boundary": ("POST", "/jobs/h/apply/",
                                   AUTH | {"Content-Type": "multipart/form-data"},
                                   b"r=0&k=1&c=0.1"),
    "utf16-form": ("POST", "/jobs/h/apply/",
                   AUTH | {"Content-Type": "application/x-www-form-urlencoded; charset=utf-16"},
                   "r=0&k=1&c=0.1".encode("utf-16")),
    "latin1-form": ("POST", "/jobs/h/apply/",
                    AUTH | {"Content-Type": "application/x-www-form-urlencoded; charset=latin-1"},
                    "r=0&k=1&c=0.1&x=\u00e9".encode("latin-1")),
    # field counts
    "too-many-query-fields-on-a-read": ("GET", f"/jobs/h/history/?{MANY_QUERY_FIELDS}", {}, b""),
    "too-many-query-fields-with-a-charset": (
        "POST", f"/jobs/h/apply/?{MANY_QUERY_FIELDS}",
        AUTH | {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}, b"r=0"),
    "too-many-form-fields": ("POST", "/jobs/h/apply/",
                             AUTH | {"Content-Type": "application/x-www-form-urlencoded"},
                             MANY_QUERY_FIELDS.encode()),
    "round-report-of-the-wrong-length": ("POST", "/jobs/h/rounds/", AUTH | JSON,
                                         b'{"t": 1, "k": [1, 1, 1], "c": [0.1, 0.1, 0.1]}'),
    # methods
    "put": ("PUT", "/jobs/h/apply/", AUTH | JSON, b'{"r": 0, "k": 1, "c": 0.1}'),
    "delete-a-job": ("DELETE", "/jobs/h/", AUTH, b""),
    "options": ("OPTIONS", "/jobs/h/reset/", AUTH, b""),
    # paths
    "unknown-path": ("GET", "/admin/", {}, b""),
    "percent-encoded-invalid-utf8-job": ("POST", "/jobs/%ff%fe/apply/", AUTH | JSON, b"{}"),
    "job-name-too-long": ("GET", "/jobs/" + "a" * 65 + "/", {}, b""),
    "dot-dot-path": ("GET", "/jobs/../../etc/passwd", {}, b""),
    # sizes
    "body-over-4-kib": ("POST", "/jobs/h/apply/", AUTH | JSON, b" " * 5000),
    "round-report-over-256-kib": ("POST", "/jobs/h/rounds/", AUTH | JSON, b" " * 300_000),
    # tokens
    "no-token": ("POST", "/jobs/h/reset/", JSON, b'{"r": 0, "t": 5}'),
    "wrong-token": ("POST", "/jobs/h/reset/", {"Authorization": "Bearer nope"} | JSON,
                    b'{"r": 0, "t": 5}'),
    "non-ascii-header-token": ("POST", "/jobs/h/reset/",
                               {"Authorization": "Bearer t\u00f6ken".encode("utf-8").decode(
                                   "latin-1")} | JSON, b'{"r": 0, "t": 5}'),
    "huge-token": ("POST", "/jobs/h/reset/", JSON,
                   json.dumps({"r": 0, "t": 5, "token": "x" * 3000}).encode()),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_request_gets_a_json_client_error(server, name):
    method, path, headers, body = HOSTILE[name]
    response = requests.request(method, server.url + path, headers=headers, data=body, timeout=30)
    assert is_json_client_error(response), (response.status_code, response.text[:300])


RAW = {
    "garbage-request-line": b"GARBAGE\r\n\r\n",
    "unsupported-transfer-coding": b"POST /jobs/h/apply/ HTTP/1.1\r\nHost: x\r\n"
                                   b"Transfer-Encoding: gzip\r\n\r\n",
    "broken-chunk-size": b"POST /jobs/h/apply/ HTTP/1.1\r\nHost: x\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
}


@pytest.mark.parametrize("name", sorted(RAW))
def test_request_gunicorn_rejects_gets_a_json_client_error(server, name):
    status, body = raw_request(server.url, RAW[name])
    assert 400 <= status < 500 and "error" in json.loads(body)


def test_head_answers_without_a_body(server):
    response = requests.head(f"{server.url}/jobs/h/", timeout=30)
    assert response.status_code == 200 and response.content == b""


def test_every_hostile_request_leaves_the_job_unchanged(server):
    before = job_view(server.url)
    for method, path, headers, body in HOSTILE.values():
        requests.request(method, server.url + path, headers=headers, data=body, timeout=30)
    for payload in RAW.values():
        raw_request(server.url, payload)
    assert job_view(server.url) == before


def load_fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_state_server",
                                                  ROOT / "scripts" / "fuzz_state_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_seeded_fuzz_run_gives_no_5xx_and_changes_no_job(tmp_path):
    fuzzer = load_fuzzer()
    proc = start_state_server(port=free_port(), token=fuzzer.TOKEN, db_path=tmp_path / "db",
                              log_path=tmp_path / "server.log")
    try:
        wait_until_up(proc.url, timeout=60, proc=proc)
        result = fuzzer.fuzz(proc.url, requests_total=1000, seed=8)
    finally:
        stop(proc)
    assert result["violations"] == []
