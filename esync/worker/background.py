"""Writes that no round waits for: a worker's round logs, and rank 0's checkpoints and
TensorBoard scalars, made in order on one thread of their own, outside the device's CPU cap.

In a synchronous mode every worker waits for the slowest one's push, so whatever rank 0 does
between two rounds delays the whole cluster when rank 0 is a slow device. Round logs of an
emulated x8 device showed it: as rank 0 (ps-lite gives rank 0 to whichever worker registers
first, a x8 device as often as a x1) it spent 3.1 of 40 s between rounds, about 19 ms a round
encoding TensorBoard scalars under its sixteenth of a core and 0.1-0.4 s at each checkpoint
(serialised, then made durable with fsync), against 0.07 s for a x1 device that was not
rank 0. On a real cluster these writes are the host's work, done while the accelerator
computes; here the training thread hands them over and goes on.

What is handed over must not change afterwards: the caller passes copies (``asnumpy``) of
arrays that training moves, and new objects for each round. A failed write is raised in the
training thread at its next hand-over, and again at every later one and at ``close``: no write
after it is made (a round log or checkpoint after a gap would claim a history that is not on
disk).
"""
from __future__ import annotations

import queue
import threading

from esync.common.speeds import communication_threads


class BackgroundWrites:
    """``submit(fn, *args)`` runs ``fn`` later on the writer thread, in submission order;
    ``close()`` waits for everything submitted. ``threaded=False`` runs each write at once, in
    the caller (same results, no thread)."""

    def __init__(self, *, threaded: bool = True):
        self._failure: BaseException | None = None
        self._jobs: queue.SimpleQueue | None = None
        self._thread = None
        if threaded:
            self._jobs = queue.SimpleQueue()
            with communication_threads():         # made before the worker joins its cap
                self._thread = threading.Thread(target=self._serve, args=(self._jobs,),
                                                name="esync-writes", daemon=True)
                self._thread.start()

    def submit(self, fn, *args, **kwargs) -> None:
        self._raise_failure()
        if self._jobs is None:
            fn(*args, **kwargs)
            return
        self._jobs.put((fn, args, kwargs))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every write submitted so far is made; raise the first that failed."""
        if self._jobs is not None:
            done = threading.Event()
            self._jobs.put(done)
            if not done.wait(timeout):
                raise TimeoutError(f"the worker's background writes did not finish within "
                                   f"{timeout:g} s (a stalled disk?)")
        self._raise_failure()

    def close(self, timeout: float | None = 120.0, *, raise_failure: bool = True) -> None:
        """Make every submitted write, then end the thread. ``raise_failure=False`` where the
        worker is already failing: its own error is the one to report."""
        try:
            self.flush(timeout)
        except BaseException:
            if raise_failure:
                raise
        finally:
            if self._jobs is not None:
                self._jobs.put(None)
                self._thread.join(timeout)
                self._jobs = None

    def _raise_failure(self) -> None:
        if self._failure is not None:      # kept: every later hand-over raises it too
            raise self._failure

    def _serve(self, jobs: queue.SimpleQueue) -> None:
        while (item := jobs.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()             # a flush waits for the writes before it
                continue
            if self._failure is not None:
                continue               # after a failed write the later ones are not made
            fn, args, kwargs = item
            try:
                fn(*args, **kwargs)
            except BaseException as exc:          # noqa: B902 - raised again in the trainer
                self._failure = exc
