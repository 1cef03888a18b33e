"""HTTP client of the ESync state server (``state_server/``), used by every esync worker.

    client = StateClient("http://10.1.1.34:10010", job="resnet18", token=os.environ["ESYNC_STATE_TOKEN"])
    client.init(num_workers=6)                     # rank 0, once, before training
    client.reset(rank, 1)                          # entering round 1
    while not client.apply(rank, k, c, t): ...     # dynamic policy: before each local iteration
    k_round = client.plan(rank, c, t)              # planned policy: once per round (legacy)
    plan = client.report_round(t, ks, cs)          # planned policy, rank 0, once per round
    client.hello(rank, host="h", device="cpu1", slowdown=1)   # dashboard, at start
    announcer.changed(6)       # a SpeedAnnouncer: hello again on a speed change, off the round

One keep-alive connection (a urllib3 connection pool of one) per client; use one client per
thread. urllib3 rather than requests: a call costs the worker about a third of the CPU time
(0.7 ms against 2 ms on the development machine), which a 10 ms local iteration notices.
Every transport failure (refused or reset connections, timeouts, an answer cut off mid-body,
protocol and decoding errors) and every 5xx answer is retried with exponential back-off for up
to ``retry_for`` seconds, so a restart of the state server pauses a job instead of killing it.
Retrying is safe because every state-changing call is idempotent on the server: calls carry the
round ``t``, rounds only move forward, ``k`` is a count rather than an increment, and ``init``
carries a key chosen once per call. A 4xx answer (bad field, wrong token, unknown job) raises
``StateServerError`` at once with the server's message. ``requests_made`` counts HTTP requests
sent, retries included (logged per round).
"""
from __future__ import annotations

import http.client
import json
import logging
import math
import secrets
import sys
import threading
import time
from urllib.parse import urlencode

import urllib3

from esync.common.errors import UserError
from esync.coordination.rules import Decision

BACKOFF_FIRST = 0.05     # seconds before the first retry; doubles each time
BACKOFF_MAX = 2.0        # longest pause between two tries

ERR_UNAVAILABLE = "state server {url} unreachable for {seconds:.1f} s: {detail}"
ERR_REJECTED = "state server rejected {path} (HTTP {status}): {message}"
ERR_NOT_JSON = "state server answered {path} with something that is not JSON (HTTP {status})"


log = logging.getLogger(__name__)

ERR_BAD_URL = "state server URL {url!r} is not http://HOST:PORT or https://HOST:PORT: {detail}"

# Errors of the caller, not of the transport: retrying cannot help.
PROGRAMMING_ERRORS = (urllib3.exceptions.LocationValueError,
                      urllib3.exceptions.ProxySchemeUnknown)
TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)


class StateServerError(UserError, RuntimeError):
    """The state server refused a call (4xx), or stayed unreachable for ``retry_for`` seconds."""

    def __init__(self, message: str, *, status: int | None = None, field: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field


class StateClient:
    """Talks to one job of a state server; see the module docstring."""

    def __init__(self, base_url: str, *, job: str = "default", token: str | None = None,
                 timeout: float = 5.0, retry_for: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.job = job
        self.timeout = timeout
        self.retry_for = retry_for
        self.requests_made = 0
        self._count_lock = threading.Lock()
        try:
            parsed = urllib3.util.parse_url(self.base_url)
            scheme = parsed.scheme
            if scheme not in ("http", "https"):
                raise urllib3.exceptions.LocationValueError(f"scheme {scheme!r}")
            # No proxy from the environment (urllib3 reads none): the server is on the LAN.
            self._pool = urllib3.connection_from_url(
                self.base_url, maxsize=1, retries=False,
                timeout=urllib3.Timeout(connect=timeout, read=timeout))
        except PROGRAMMING_ERRORS as exc:
            raise StateServerError(ERR_BAD_URL.format(url=base_url, detail=exc)) from None
        self._prefix = (parsed.path or "").rstrip("/")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    # -- the API ------------------------------------------------------------------------

    def init(self, num_workers: int, epsilon: float | str = "auto", policy: str = "dynamic",
             sizing=None) -> dict:
        """Create the job (or start a new run of it): round 1, no worker state.

        ``sizing`` (``esync.coordination.rules.RoundSizing``; None: rounds sized by compute
        alone). A key drawn once per call makes its retries harmless (no second run).
        """
        fields = {"num_workers": num_workers, "epsilon": epsilon, "policy": policy,
                  "key": secrets.token_hex(16)}
        if sizing is not None:
            fields.update(sizing.as_dict())
        return self._post("init", fields)

    def apply(self, rank: int, k: int, c: float, t: int | None = None) -> bool:
        """Dynamic policy: should worker ``rank`` (in round ``t``) stop computing now?"""
        return self.decide(rank, k, c, t).ready

    def decide(self, rank: int, k: int, c: float, t: int | None = None,
               d: float | None = None) -> Decision:
        """``apply`` with the answer's lease (``esync.coordination.job.Decision``); a server that sends no
        ``budget`` (an older one) gives 0: ask before every iteration, as the original did."""
        fields = {"r": rank, "k": k, "c": c}
        if t is not None:
            fields["t"] = t
        if d is not None:
            fields["d"] = d                      # communication time of the last exchange
        answer = self._post("apply", fields)
        return Decision(bool(answer["ready"]), _seconds(answer, "budget"),
                        _seconds(answer, "wait"), bool(answer.get("sit_out", 0)))

    def plan(self, rank: int, c: float, t: int | None = None) -> int:
        """Planned policy (one call per worker): local iterations to run in round ``t``."""
        fields = {"r": rank, "c": c}
        if t is not None:
            fields["t"] = t
        return int(self._post("plan", fields)["k"])

    def report_round(self, t: int, k, c, d=None, o=None) -> list[int]:
        """Planned policy, rank 0: every worker's k and c of round ``t``; returns the plan.

        The plan holds every worker's local iterations for the next round the server can still
        influence; a repeated report of round ``t`` returns the same plan.
        """
        return self.report_rounds([(t, k, c, d, o)])[1]

    def report_rounds(self, reports) -> tuple[int, list[int]]:
        """Several ``(t, k, c[, d])`` round reports in order, in one call (a reporter that fell
        behind catches up; at most 64, and at most 2 MiB of JSON); returns the last ``(t, plan)``.
        ``d``: every worker's communication time in round t (sizes the rounds), or None.
        """
        items = []
        for report in reports:
            t, k, c = report[:3]
            item = {"t": t, "k": [int(v) for v in k], "c": [float(v) for v in c]}
            if len(report) > 3 and report[3] is not None:
                item["d"] = [float(v) for v in report[3]]
            if len(report) > 4 and report[4] is not None:
                item["o"] = [float(v) for v in report[4]]
            items.append(item)
        answer = self._post("rounds", {"rounds": items})
        return int(answer["t"]), [int(v) for v in answer["plan"]]

    def reset(self, rank: int, round: int) -> dict:
        """Tell the server that worker ``rank`` now enters ``round``."""
        return self._post("reset", {"r": rank, "t": round})

    def hello(self, rank: int, *, host: str, device: str, slowdown: float | None = None) -> dict:
        """Tell the dashboard where worker ``rank`` runs and, if given, its device's slow-down
        factor in force (at start, and again when the factor changes). Without ``slowdown`` the
        field is not sent, as before (the dashboard shows the factor as unknown)."""
        fields = {"r": rank, "host": host, "device": device}
        if slowdown is not None:
            fields["slowdown"] = float(slowdown)
        return self._post("hello", fields)

    def score(self, round: int, *, time: float, accuracy: float) -> dict:
        """Evaluator: the test accuracy of the checkpoint of ``round``, for the dashboard."""
        return self._post("scores", {"round": round, "time": time, "accuracy": accuracy})

    def state(self) -> dict:
        """The live state of the job (every worker's k, c, ready, round)."""
        return self._request("GET", self._path(""))

    def history(self, *, run: int | None = None, since: int | None = None,
                limit: int | None = None) -> dict:
        """Closed rounds of the job as persisted by the server (``since``: first round)."""
        params = {name: value for name, value in (("run", run), ("since", since),
                                                  ("limit", limit)) if value is not None}
        return self._request("GET", self._path("history"), params=params)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> "StateClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transport ----------------------------------------------------------------------

    def _path(self, action: str) -> str:
        return f"/jobs/{self.job}/{action}/" if action else f"/jobs/{self.job}/"

    def _post(self, action: str, fields: dict) -> dict:
        return self._request("POST", self._path(action), body=json.dumps(fields).encode())

    def _request(self, method: str, path: str, *, body: bytes | None = None,
                 params: dict | None = None) -> dict:
        url = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        deadline = time.monotonic() + self.retry_for
        pause = BACKOFF_FIRST
        failures = 0
        while True:
            with self._count_lock:
                self.requests_made += 1
            try:
                response = self._pool.urlopen(method, url, body=body, headers=self._headers,
                                              redirect=False, retries=False)
            except PROGRAMMING_ERRORS as exc:
                raise StateServerError(ERR_BAD_URL.format(url=self.base_url,
                                                          detail=exc)) from None
            except TRANSPORT_ERRORS as exc:
                detail = f"{type(exc).__name__}: {exc}"
            else:
                if response.status < 500:
                    if failures:
                        log.warning("state server %s answered %s again after %d failed tries",
                                    self.base_url, path, failures)
                    return self._decode(response, path)
                detail = f"HTTP {response.status}"
            failures += 1
            if failures == 1:
                log.warning("state server call %s %s failed (%s); retrying for up to %.0f s",
                            method, path, detail, self.retry_for)
            now = time.monotonic()
            if now >= deadline:
                raise StateServerError(ERR_UNAVAILABLE.format(
                    url=self.base_url, seconds=self.retry_for, detail=detail))
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, BACKOFF_MAX)

    @staticmethod
    def _decode(response: urllib3.BaseHTTPResponse, path: str) -> dict:
        status = response.status
        try:
            data = json.loads(response.data)
        except ValueError:                      # UnicodeDecodeError is one too
            raise StateServerError(ERR_NOT_JSON.format(path=path, status=status),
                                   status=status) from None
        if status >= 400:
            message = data.get("error", "") if isinstance(data, dict) else str(data)
            field = data.get("field") if isinstance(data, dict) else None
            raise StateServerError(ERR_REJECTED.format(path=path, status=status,
                                                       message=message),
                                   status=status, field=field)
        return data


def _seconds(answer: dict, name: str) -> float:
    """A duration field of an ``/apply/`` answer; 0 when it is missing (an older server) or not a
    finite number of seconds >= 0."""
    value = answer.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        return 0.0
    return float(value)


class ReadinessAsker:
    """The dynamic policy as a worker speaks it: ``continue_local`` before each local iteration.

    - It asks ``/apply/`` only when the lease of the last "not ready" (``Decision.budget``) does
      not cover the coming iteration; the server still says "ready".
    - A worker that ran more than one iteration last round (a fast one) skips the round's first
      question: its answer is always "not ready" (everyone computes once), and a fast worker's
      burst of first questions would queue ahead of the slowest worker's, whose first question
      starts the round's clock. Its first call (k = 1, with ``t``) enters the round.
    - A worker that ran one iteration (possibly the slowest, or one whose k was unknown) asks at
      k = 0, when the answer is always "not ready" (everyone computes once). Given ``submit``
      (how ESync sends a question without waiting: a future), it computes while the question
      travels and takes the answer (its lease) before its next question; the server's clock for
      its iteration then starts late by the question's transit, a millisecond or two on the
      host's uncapped thread, where waiting cost the slowest device the round trip and, when its
      CPU cap had run out, the rest of a CFS period (on a x8 device 17-29 ms of each round were
      spent asking before, 8-9 ms after).
      Without ``submit`` it waits, so that clock never starts after the iteration does.
    - ``k`` counts the iterations carried into the round (``--carry``): a worker that carried
      some asks before its first own iteration, and may be ready without one.
    - ``wait`` keeps the last "ready"'s ``Decision.wait``: how long the slowest still computes;
      ``sitting_out`` its ``Decision.sit_out``: from the next round on this worker computes
      nothing, and asks at k = 0 (waiting for the answer, which is "ready") in every round.
      With ``may_sit_out`` (the job lets devices sit out) it also waits for its k = 0 answer
      until its first "ready": the first question carries the warm-up step's duration, from
      which the server may tell a very slow device to sit out before its first iteration.
    - The lease runs from the answer's arrival: the server decided between the question and the
      answer, and under load most of a call is its wait in the server's queue, before the
      decision. The lease can thus end late by the answer's transit back (well under a
      millisecond on a LAN), far inside the ``c_i / N`` overshoot the automatic slack accepts.
    """

    def __init__(self, client: StateClient, rank: int, *, clock=time.perf_counter, call=None,
                 submit=None, may_sit_out: bool = False):
        self.client, self.rank, self.clock = client, rank, clock
        self.call = call or (lambda fn, *args: fn(*args))   # how a question is sent
        self.submit = submit            # how a k = 0 question is sent without waiting (a future)
        self.pending = None             # that question's future: (answer, arrival time)
        self.lease_ends = 0.0
        self.last_round_k = 1           # before round 1 nothing is known: ask at k = 0
        self.comm = None                # the last exchange's communication time, sent once
        self.wait = 0.0                 # the last "ready"'s Decision.wait: the slowest's rest
        self.sitting_out = False        # ... and its Decision.sit_out
        # Before the first "ready" the k = 0 answer is awaited where the job lets devices sit out
        self.was_ready = not may_sit_out

    def continue_local(self, k: int, last_c: float, t: int, *, timing=None) -> bool:
        """True: run another local iteration in round ``t`` (``k`` done, the last took
        ``last_c`` s). ``timing``: a context manager factory wrapped around each HTTP call."""
        self._take_pending(timing)
        if k == 0:
            self.lease_ends = 0.0
            if self.last_round_k > 1 and not self.sitting_out:
                return True
        elif self.clock() + last_c <= self.lease_ends:
            return True
        ask = self._question(k, last_c, t)
        if k == 0 and self.submit is not None and not self.sitting_out and self.was_ready:
            self.pending = self.submit(self._answered, *ask)
            return True
        decision = self._timed(timing, self.call, *ask)
        if decision.ready and (k > 0 or decision.sit_out):
            self.lease_ends, self.last_round_k, self.wait = 0.0, k, decision.wait
            self.sitting_out, self.was_ready = decision.sit_out, True
            return False
        # Counted from the answer: the server computed the budget when it took the call, after
        # the call's wait in its queue (most of a call under load), not when it was sent.
        self.lease_ends = self.clock() + decision.budget
        return True

    def begin_next_round(self, t: int, last_c: float) -> None:
        """Round ``t``'s first iteration starts now, before the round does: the slowest device
        carrying through the exchange (``--carry-slowest``) sends its k = 0 question as its
        carried iteration starts, without waiting. Asked only when that iteration has ended,
        the server would take the slowest as not yet started and give the fast workers a whole
        round's lease from their first question; their pushes then came up to an iteration
        after the slowest was ready, and the slowest carried a second iteration (rounds of
        two slowest iterations in half the rounds, docs/ALGORITHM.md "Iterations carried
        through the exchange")."""
        if self.submit is None:
            return
        self._take_pending(None)
        self.lease_ends = 0.0
        self.pending = self.submit(self._answered, *self._question(0, last_c, t))

    def _question(self, k: int, last_c: float, t: int) -> tuple:
        """The call to send: ``decide`` with this worker's report (and the last exchange's
        communication time, sent once)."""
        comm, self.comm = self.comm, None
        return (self.client.decide, self.rank, k, last_c, t, comm)

    def _take_pending(self, timing) -> None:
        """The answer to a k = 0 question sent without waiting (normally back long ago): its
        lease, counted from its arrival; a failed call raises here, in the training thread."""
        if self.pending is None:
            return
        future, self.pending = self.pending, None
        decision, arrived = (future.result() if future.done()
                             else self._timed(timing, future.result))
        self.lease_ends = arrived + decision.budget

    @staticmethod
    def _timed(timing, fn, *args):
        """``fn(*args)``, inside ``timing()`` when given (the round log's "check ready")."""
        if timing is None:
            return fn(*args)
        with timing():
            return fn(*args)

    def _answered(self, fn, *args):
        """``fn(*args)`` and the moment its answer came back (where it runs)."""
        decision = fn(*args)
        return decision, self.clock()


class SpeedAnnouncer:
    """Tells the dashboard a worker's new slow-down factor (``hello`` again) when it changes.

    The hello leaves from a background thread with its own client (one client per thread), so a
    round never waits for the dashboard. The dashboard is for people, not for training: a refused
    or unreachable state server (``StateServerError`` after the client's retries) is reported
    through ``report`` and dropped, never raised. Only the newest factor waits to be sent, so a
    change overtaken by a newer one before its hello left is not sent: at most one hello per
    change, and never an older factor after a newer one.
    """

    def __init__(self, client: StateClient, rank: int, *, host: str, device: str,
                 report=None, close_timeout: float = 2.0):
        self.client, self.rank, self.host, self.device = client, rank, host, device
        self.report = report or (lambda line: print(line, file=sys.stderr, flush=True))
        self.close_timeout = close_timeout
        self.sent = 0                              # hellos the server accepted
        self._pending: float | None = None
        self._closed = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="esync-speed-announcer",
                                        daemon=True)
        self._thread.start()

    def changed(self, slowdown: float) -> None:
        """Never blocks on HTTP: the factor replaces any still unsent one."""
        with self._wake:
            self._pending = float(slowdown)
            self._wake.notify()

    def close(self) -> None:
        """Send what is pending if the server answers within ``close_timeout``, then stop."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(self.close_timeout)
        self.client.close()

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._pending is None and not self._closed:
                    self._wake.wait()
                if self._pending is None:
                    return
                slowdown, self._pending = self._pending, None
            try:
                self.client.hello(self.rank, host=self.host, device=self.device,
                                  slowdown=slowdown)
                self.sent += 1
            except Exception as exc:                  # noqa: BLE001 - training must go on
                self.report(f"[rank {self.rank} {self.device}] the dashboard was not told of "
                            f"slow-down x{slowdown:g}: {exc}")
