"""A real state server (gunicorn, started by esync.coordination.service) on a free loopback port."""
import http.client
import socket
import threading
import time

import pytest

import requests

from esync.coordination.client import SpeedAnnouncer, StateClient, StateServerError
from esync.coordination.service import free_port, start_state_server, stop, wait_until_up

TOKEN = "live-token-19c2"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("state-live")
    proc = start_state_server(port=free_port(), token=TOKEN, db_path=folder / "db.sqlite3",
                              log_path=folder / "server.log")
    try:
        wait_until_up(proc.url, timeout=30, proc=proc)
        yield proc
    finally:
        stop(proc)


def test_client_round_trip(server):
    client = StateClient(server.url, job="trip", token=TOKEN)
    assert client.init(2)["round"] == 1
    assert client.apply(0, 0, 0.0) is False
    assert client.apply(0, 1, 0.01) is False         # round 1: rank 1 is not timed yet
    assert client.apply(1, 1, 0.2) is True          # the slowest, after its iteration
    assert client.reset(1, 2) == {"round": 2}
    assert client.state()["round"] == 2
    assert client.history()["rounds"][0]["workers"][0]["rank"] == 1
    assert client.requests_made == 7


def test_client_gives_the_lease_and_history_query(server):
    client = StateClient(server.url, job="lease", token=TOKEN)
    client.init(2, epsilon=0.0)
    client.apply(0, 1, 0.01)
    client.apply(1, 1, 0.5)
    client.reset(0, 2)
    client.reset(1, 2)
    client.apply(1, 0, 0.5, t=2)                      # the slowest starts round 2
    decision = client.decide(0, 0, 0.01, t=2)
    assert not decision.ready and 0.3 < decision.budget <= 0.5
    assert [r["round"] for r in client.history(since=1, limit=1)["rounds"]] == [1]


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1", "127.0.0.1:10010", "http://"])
def test_client_refuses_a_url_that_is_not_http(url):
    with pytest.raises(StateServerError, match="is not http://HOST:PORT"):
        StateClient(url)


def test_planned_round_trip(server):
    client = StateClient(server.url, job="planned", token=TOKEN)
    client.init(2, epsilon=0.0, policy="planned")
    client.plan(1, 0.08)
    assert client.plan(0, 0.02) == 4


def test_client_raises_at_once_on_a_rejected_call(server):
    client = StateClient(server.url, job="trip", token="wrong", retry_for=30)
    started = time.monotonic()
    with pytest.raises(StateServerError, match="wrong token") as info:
        client.apply(0, 1, 0.1)
    assert info.value.status == 403 and time.monotonic() - started < 5


def test_concurrent_clients_lose_and_mix_no_record(server):
    workers, reports = 32, 5
    StateClient(server.url, job="crowd", token=TOKEN).init(workers)
    barrier = threading.Barrier(workers)
    errors = []

    def worker(rank):
        try:
            with StateClient(server.url, job="crowd", token=TOKEN, timeout=30) as client:
                barrier.wait()
                for k in range(reports + 1):
                    client.apply(rank, k, 0.001 * (rank + 1))
                client.reset(rank, 2)
        except Exception as exc:    # pragma: no cover - reported by the assertion
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(rank,)) for rank in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    history = StateClient(server.url, job="crowd", token=TOKEN).history()
    records = history["rounds"][0]["workers"]
    assert not errors and history["current_round"] == 2
    assert [(r["rank"], r["k"], r["c"]) for r in records] == [
        (rank, reports, 0.001 * (rank + 1)) for rank in range(workers)]


def test_job_survives_a_server_restart(tmp_path):
    port = free_port()
    paths = {"db_path": tmp_path / "db.sqlite3", "log_path": tmp_path / "server.log"}
    proc = start_state_server(port=port, token=TOKEN, **paths)
    wait_until_up(proc.url, timeout=30, proc=proc)
    client = StateClient(proc.url, job="phoenix", token=TOKEN, retry_for=60)
    client.init(2)
    assert client.apply(0, 1, 0.01) is False         # round 1: rank 1 is not timed yet
    assert client.apply(1, 1, 0.3) is True           # both timed, the slowest ready
    for rank in (0, 1):
        client.reset(rank, 3)
    stop(proc, hard=True)                           # a crash

    answers = []
    during = threading.Thread(target=lambda: answers.append(client.apply(1, 1, 0.3)))
    during.start()                                  # called while the server is down
    time.sleep(1.0)
    proc = start_state_server(port=port, token=TOKEN, **paths)
    try:
        during.join(timeout=60)
        state = client.state()
    finally:
        stop(proc)
    assert answers == [True]
    assert (state["round"], state["num_workers"], state["workers"][1]["c"]) == (3, 2, 0.3)


class CuttingProxy:
    """A loopback HTTP proxy in front of a real state server that forwards each request and cuts
    the first ``cuts`` answers to ``path_part`` in the middle of their body (the server has
    processed the call; the client sees "Response ended prematurely")."""

    def __init__(self, upstream: str, *, path_part: str, cuts: int):
        host, port = upstream.rsplit("/", 1)[-1].rsplit(":", 1)
        self.upstream = (host, int(port))
        self.path_part, self.cuts, self.cut_done = path_part.encode(), cuts, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                self._one(conn)

    def _one(self, conn):
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = conn.recv(65536)
            if not chunk:
                return
            request += chunk
        head, _, body = request.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += conn.recv(65536)
        with socket.create_connection(self.upstream, timeout=30) as up:
            up.sendall(head + b"\r\n\r\n" + body)
            answer = http.client.HTTPResponse(up)
            answer.begin()
            content = answer.read()
        cut = self.path_part in head.split(b"\r\n")[0] and self.cut_done < self.cuts
        sent = content[: len(content) // 2] if cut else content
        self.cut_done += cut
        conn.sendall(f"HTTP/1.1 {answer.status} OK\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(content)}\r\nConnection: close\r\n\r\n".encode()
                     + sent)

    def close(self):
        self.listener.close()


def test_answer_cut_mid_body_is_retried_until_it_arrives(server):
    StateClient(server.url, job="cut", token=TOKEN).init(2)
    proxy = CuttingProxy(server.url, path_part="/reset/", cuts=2)
    try:
        client = StateClient(proxy.url, job="cut", token=TOKEN, retry_for=30)
        answer = client.reset(1, 2)
    finally:
        proxy.close()
    assert (answer, proxy.cut_done, client.requests_made) == ({"round": 2}, 2, 3)


def test_reset_whose_answer_was_cut_counts_once(server):
    direct = StateClient(server.url, job="cut-once", token=TOKEN)
    direct.init(2)
    direct.apply(1, 1, 0.25)
    proxy = CuttingProxy(server.url, path_part="/reset/", cuts=1)
    try:
        StateClient(proxy.url, job="cut-once", token=TOKEN, retry_for=30).reset(1, 2)
    finally:
        proxy.close()
    rounds = direct.history()["rounds"]
    assert [(r["round"], [(w["rank"], w["k"]) for w in r["workers"]]) for r in rounds] == [
        (1, [(1, 1)])]


def test_restart_rebuilds_every_workers_round_and_duration(tmp_path):
    port = free_port()
    paths = {"db_path": tmp_path / "db.sqlite3", "log_path": tmp_path / "server.log"}
    proc = start_state_server(port=port, token=TOKEN, **paths)
    try:
        wait_until_up(proc.url, timeout=60, proc=proc)
        client = StateClient(proc.url, job="rebuild", token=TOKEN, retry_for=60)
        client.init(3)
        for rank, (c, t) in enumerate([(0.05, 2), (0.2, 3), (0.1, 4)]):
            client.apply(rank, 1, c)
            client.reset(rank, t)
        stop(proc, hard=True)                        # a crash right after the acknowledgements
        proc = start_state_server(port=port, token=TOKEN, **paths)
        wait_until_up(proc.url, timeout=60, proc=proc)
        workers = client.state()["workers"]
    finally:
        stop(proc)
    assert [(w["round"], w["c"]) for w in workers] == [(2, 0.05), (3, 0.2), (4, 0.1)]


# -- hello and the slow-down factor --------------------------------------------------------------

def dashboard_workers(server, job: str) -> list:
    return requests.get(f"{server.url}/dashboard/api/jobs/{job}/", timeout=10).json()["workers"]


def test_client_hello_sends_the_slowdown_factor(server):
    client = StateClient(server.url, job="speed", token=TOKEN)
    client.init(2)
    client.hello(0, host="h", device="cpu0")
    client.hello(1, host="h", device="cpu1", slowdown=6)
    assert [w["slowdown"] for w in dashboard_workers(server, "speed")] == [None, 6.0]


def test_client_hello_with_a_bad_slowdown_is_refused_naming_the_field(server):
    client = StateClient(server.url, job="speed-bad", token=TOKEN)
    client.init(2)
    with pytest.raises(StateServerError) as info:
        client.hello(0, host="h", device="cpu0", slowdown=0.5)
    assert info.value.status == 400 and info.value.field == "slowdown"


def test_speed_announcer_sends_the_new_factor_without_blocking(server):
    StateClient(server.url, job="speed-live", token=TOKEN).init(2)
    announcer = SpeedAnnouncer(StateClient(server.url, job="speed-live", token=TOKEN), 1,
                               host="h", device="cpu1")
    started = time.monotonic()
    announcer.changed(6)
    assert time.monotonic() - started < 0.05           # the round does not wait for HTTP
    announcer.close()
    assert announcer.sent == 1
    assert dashboard_workers(server, "speed-live")[1]["slowdown"] == 6.0


def test_speed_announcer_reports_a_refused_hello_instead_of_raising(server):
    StateClient(server.url, job="speed-refused", token=TOKEN).init(2)
    lines = []
    announcer = SpeedAnnouncer(StateClient(server.url, job="speed-refused", token="wrong"), 0,
                               host="h", device="cpu0", report=lines.append)
    announcer.changed(6)
    announcer.close()
    assert announcer.sent == 0 and len(lines) == 1 and "wrong token" in lines[0]


def test_speed_announcer_reports_an_unreachable_server_instead_of_raising():
    lines = []
    client = StateClient(f"http://127.0.0.1:{free_port()}", job="nobody", retry_for=0.3)
    announcer = SpeedAnnouncer(client, 0, host="h", device="cpu0", report=lines.append,
                               close_timeout=10)
    started = time.monotonic()
    announcer.changed(6)
    assert time.monotonic() - started < 0.05
    announcer.close()
    assert announcer.sent == 0 and len(lines) == 1 and "unreachable" in lines[0]
