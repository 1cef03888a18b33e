"""Rank 0's reports of each round to the state server under ``--policy planned``.

The planned policy keeps HTTP off every worker's round: rank 0 hands each round's summed control
vector (every worker's ``k_i``, ``c_i``, ``d_i``, ``o_i``) to a background thread, which posts
it (``POST /jobs/<job>/rounds/``) and keeps the newest plan the state server answered; rank 0
writes that plan into the plan slots of its next push (``esync.worker.algorithms.esync.sizing``).
"""
from __future__ import annotations

import queue
import threading

from esync.coordination.client import StateClient

MAX_REPORTS_PER_CALL = 64                # the state server's limit for one batch of round reports


class PlanReporter:
    """Rank 0's reports to the state server, posted in order from a background thread.

    ``submit`` never blocks on HTTP; ``newest`` gives the latest ``(round, plan)`` answered. A
    refused or unreachable state server (``StateServerError`` after the client's retries) is
    raised in the training thread at the next call.
    """

    def __init__(self, client: StateClient, *, close_timeout: float = 10.0):
        self.client = client
        self.close_timeout = close_timeout
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._newest = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="esync-plan-reporter",
                                        daemon=True)
        self._thread.start()

    def submit(self, t: int, ks, cs, ds=None, os_=None) -> None:
        self._raise_if_failed()
        self._queue.put((t, list(ks), list(cs), None if ds is None else list(ds),
                         None if os_ is None else list(os_)))

    def newest(self):
        self._raise_if_failed()
        with self._lock:
            return self._newest

    def close(self) -> None:
        """Send what is queued (the history wants every round), then stop the thread."""
        self._queue.put(None)
        self._thread.join(self.close_timeout)
        self.client.close()

    def _run(self) -> None:
        while True:
            batch = self._take_pending()
            if not batch:
                return
            try:
                newest = self._report(batch)
            except BaseException as exc:             # handed to the training thread
                self._error = exc
                return
            with self._lock:
                self._newest = newest
            if batch[-1] is None:
                return

    def _take_pending(self) -> list:
        """The next report, plus whatever queued up behind it (a reporter that fell behind)."""
        batch = [self._queue.get()]
        while batch[-1] is not None and len(batch) < MAX_REPORTS_PER_CALL:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch if batch[0] is not None else []

    def _report(self, batch: list):
        reports = [item for item in batch if item is not None]
        several = getattr(self.client, "report_rounds", None)
        if len(reports) > 1 and several is not None:
            t, plan = several(reports)                # one call, one transaction
        else:
            for t, ks, cs, ds, os_ in reports:
                plan = self.client.report_round(t, ks, cs, ds, os_)
        return t, [int(k) for k in plan]

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
