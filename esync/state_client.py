"""HTTP client of the ESync state server (``state_server/``), used by every esync worker.

    client = StateClient("http://10.1.1.34:10010", job="resnet18", token=os.environ["ESYNC_STATE_TOKEN"])
    client.init(num_workers=6)                     # rank 0, once, before training
    client.reset(rank, 1)                          # entering round 1
    while not client.apply(rank, k, c): ...        # dynamic policy: before each local iteration
    k_round = client.plan(rank, c)                 # planned policy: once per round

One keep-alive connection (``requests.Session``) per client; use one client per thread.
Connection errors, timeouts and 5xx answers are retried with exponential back-off for up to
``retry_for`` seconds, so a restart of the state server pauses a job instead of killing it; a 4xx
answer (bad field, wrong token, unknown job) raises ``StateServerError`` at once with the server's
message. ``requests_made`` counts HTTP requests sent, retries included (logged per round).
"""
from __future__ import annotations

import threading
import time

import requests

from esync.errors import UserError

BACKOFF_FIRST = 0.05     # seconds before the first retry; doubles each time
BACKOFF_MAX = 2.0        # longest pause between two tries

ERR_UNAVAILABLE = "state server {url} unreachable for {seconds:.1f} s: {detail}"
ERR_REJECTED = "state server rejected {path} (HTTP {status}): {message}"
ERR_NOT_JSON = "state server answered {path} with something that is not JSON (HTTP {status})"


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
        self._session = requests.Session()
        self._session.trust_env = False     # no proxy or .netrc look-ups: the server is on the LAN
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    # -- the API ------------------------------------------------------------------------

    def init(self, num_workers: int, epsilon: float | str = "auto", policy: str = "dynamic") -> dict:
        """Create the job (or start a new run of it): round 1, no worker state."""
        return self._post("init", {"num_workers": num_workers, "epsilon": epsilon,
                                   "policy": policy})

    def apply(self, rank: int, k: int, c: float) -> bool:
        """Dynamic policy: should worker ``rank`` stop computing and aggregate now?"""
        return bool(self._post("apply", {"r": rank, "k": k, "c": c})["ready"])

    def plan(self, rank: int, c: float) -> int:
        """Planned policy: how many local iterations to run this round."""
        return int(self._post("plan", {"r": rank, "c": c})["k"])

    def reset(self, rank: int, round: int) -> dict:
        """Tell the server that worker ``rank`` now enters ``round``."""
        return self._post("reset", {"r": rank, "t": round})

    def hello(self, rank: int, *, host: str, device: str) -> dict:
        """Tell the dashboard where worker ``rank`` runs (once, at start)."""
        return self._post("hello", {"r": rank, "host": host, "device": device})

    def score(self, round: int, *, time: float, accuracy: float) -> dict:
        """Evaluator: the test accuracy of the checkpoint of ``round``, for the dashboard."""
        return self._post("scores", {"round": round, "time": time, "accuracy": accuracy})

    def state(self) -> dict:
        """The live state of the job (every worker's k, c, ready, round)."""
        return self._request("GET", self._path(""))

    def history(self, *, run: int | None = None) -> dict:
        """Closed rounds of the job as persisted by the server."""
        params = {} if run is None else {"run": run}
        return self._request("GET", self._path("history"), params=params)

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> "StateClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transport ----------------------------------------------------------------------

    def _path(self, action: str) -> str:
        return f"/jobs/{self.job}/{action}/" if action else f"/jobs/{self.job}/"

    def _post(self, action: str, fields: dict) -> dict:
        return self._request("POST", self._path(action), json=fields)

    def _request(self, method: str, path: str, **kwargs) -> dict:
        url = self.base_url + path
        deadline = time.monotonic() + self.retry_for
        pause = BACKOFF_FIRST
        while True:
            with self._count_lock:
                self.requests_made += 1
            try:
                response = self._session.request(method, url, timeout=self.timeout, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as exc:
                detail = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 500:
                    return self._decode(response, path)
                detail = f"HTTP {response.status_code}"
            now = time.monotonic()
            if now >= deadline:
                raise StateServerError(ERR_UNAVAILABLE.format(
                    url=self.base_url, seconds=self.retry_for, detail=detail))
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, BACKOFF_MAX)

    @staticmethod
    def _decode(response: requests.Response, path: str) -> dict:
        try:
            data = response.json()
        except ValueError:
            raise StateServerError(ERR_NOT_JSON.format(path=path, status=response.status_code),
                                   status=response.status_code) from None
        if response.status_code >= 400:
            message = data.get("error", "") if isinstance(data, dict) else str(data)
            field = data.get("field") if isinstance(data, dict) else None
            raise StateServerError(ERR_REJECTED.format(path=path, status=response.status_code,
                                                       message=message),
                                   status=response.status_code, field=field)
        return data
