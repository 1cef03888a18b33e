"""Watch a running job through its handles: progress, failures, stalls and restarts.

The supervisor knows nothing of Popen, ssh or Slurm: it polls handles, reads the round logs the
workers write into the shared log folder, and decides.

- **A death** (a non-zero exit, or scheduler, server or state server ending while workers still
  need them) stops every process and names the root cause with the tail of its log. A dead state
  server is first restarted in place (same port, token and database; workers retry their calls
  meanwhile), up to ``state_restarts`` times.
- **A stall** (no worker finished a round for the stall timeout) names the stuck processes and
  what they are doing, prints the state server's view of every worker, and stops everything.
- **Healing**: with ``restarts`` N, after a death or a stall the whole cluster is started again
  from the last checkpoint (``on_restart`` prepares the folder and returns the new plan), up to N
  times. A whole-cluster restart is the only way: ps-lite cannot admit a new worker into a
  running job, and the survivors of a death are stuck in its barriers.
- **Signals**: SIGINT, SIGTERM and SIGHUP stop every process and end with 130.
"""
from __future__ import annotations

import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from esync.common import runlayout
from esync.common.runlayout import EvaluationLog
from esync.launch.backends.base import Backend, Handle
from esync.launch.roles import RoleSpec

STOP_GRACE = 5.0            # seconds between SIGTERM and SIGKILL when stopping
SERVICE_GRACE = 15.0        # scheduler/servers may end this long before the last worker
FINISH_TIMEOUT = 120.0      # the evaluator may take this long to score the last checkpoints
MIN_STALL = 60.0            # the default stall timeout is max(MIN_STALL, STALL_ROUNDS x median)
STALL_ROUNDS = 20
SERVICES = ("scheduler", "server", "rendezvous", "state")


@dataclass
class Options:
    stall_timeout: float | None = None    # None: max(60 s, 20 x the median round time)
    startup_timeout: float = 180.0        # the first round may take this long (imports, data)
    restarts: int = 0                     # whole-cluster restarts from the last checkpoint
    state_restarts: int = 3               # in-place restarts of a dying state server
    poll_seconds: float = 0.25


class RoundWatch:
    """How many rounds each worker has logged, and when its newest log was written."""

    def __init__(self, mode_dir: Path):
        self.mode_dir = Path(mode_dir)

    def folder(self, spec: RoleSpec) -> Path:
        return runlayout.device_dir(self.mode_dir, spec.host, spec.device)

    def scan(self, specs) -> dict[str, tuple[int, float]]:
        """{worker name: (rounds logged, newest log's mtime)}."""
        result = {}
        for spec in specs:
            count, newest = 0, 0.0
            try:
                for entry in runlayout.round_logs(self.folder(spec)).values():
                    count += 1
                    newest = max(newest, entry.stat().st_mtime)
            except OSError:
                pass
            result[spec.name] = (count, newest)
        return result


class StallWatch:
    """Decides when the job has stalled: no worker finished a round for the stall timeout.

    Pure bookkeeping (feed it scans with the time), so it is tested without processes. A round
    counts when a worker's log count or newest log time changes, so the rounds a resumed job
    re-runs (and rewrites) count too. Before the first round of this start, the limit is at least
    ``startup`` seconds: importing MXNet, loading data and the ps-lite rendezvous come first;
    and while some worker has not finished its first round, the job is not stalled before
    ``startup`` seconds either.
    """

    def __init__(self, timeout: float | None, startup: float, now: float):
        self.timeout, self.startup = timeout, startup
        self.started = self.last_progress = now
        self.seen: dict[str, tuple[int, float]] | None = None
        self.last_change: dict[str, float] = {}
        self.round_times: list[float] = []
        self.any_round = False

    def observe(self, scan: dict[str, tuple[int, float]], now: float) -> None:
        if self.seen is None:                   # what earlier runs left is no progress
            self.seen = dict(scan)
            return
        for name, (count, newest) in scan.items():
            before = self.seen.get(name, (0, 0.0))
            if (count, newest) == before:
                continue
            rounds = max(1, count - before[0])
            since = self.last_change.get(name)
            if since is not None:
                self.round_times.extend([(now - since) / rounds] * min(rounds, 50))
                del self.round_times[:-1000]
            self.last_change[name] = now
            self.last_progress = now
            self.any_round = True
        self.seen = dict(scan)

    def median_round(self) -> float | None:
        return statistics.median(self.round_times) if self.round_times else None

    def limit(self) -> float:
        if self.timeout is not None:
            limit = self.timeout
        else:
            median = self.median_round()
            limit = max(MIN_STALL, STALL_ROUNDS * median) if median else MIN_STALL
        return limit if self.any_round else max(limit, self.startup)

    def stalled(self, now: float) -> bool:
        if now - self.last_progress <= self.limit():
            return False
        # A worker yet to finish its first round of this start has the start-up allowance: a
        # very slow device's first iteration may outlast the others' training (ASGD, 300:1).
        waiting = any(name not in self.last_change for name in self.seen or {})
        return not (waiting and now - self.started <= self.startup)

    def idle(self, name: str, now: float) -> float:
        """Seconds since worker ``name`` last finished a round (or since the start)."""
        return now - self.last_change.get(name, self.started)


class RoundProgress:
    """Rounds done (the most advanced worker), latest test accuracy and elapsed time."""

    def __init__(self, mode_dir: Path, total_rounds: int | None, desc: str, quiet: bool):
        self.quiet = quiet
        self.start = time.monotonic()
        self.last = 0.0
        self.bar = None
        self.tty = sys.stderr.isatty()
        if not quiet:
            from tqdm import tqdm
            self.bar = tqdm(total=total_rounds or None, unit="round", desc=desc,
                            dynamic_ncols=True, file=sys.stderr, disable=not self.tty)
        self.evaluations = EvaluationLog(runlayout.evaluations_file(mode_dir))

    def update(self, rounds: int, final: bool = False) -> None:
        """A live bar on a terminal; a plain line every 10 s in a log file or CI."""
        now = time.monotonic()
        if self.quiet or (now - self.last < (1.0 if self.tty else 10.0) and not final):
            return
        self.last = now
        acc = self.evaluations.poll()
        shown = f"acc={acc:.4f}" if acc is not None else "acc=n/a"
        if not self.tty:
            print(f"esync-cluster: {now - self.start:6.0f}s  round {rounds}  {shown}",
                  file=sys.stderr, flush=True)
            return
        if self.bar is None:
            return
        self.bar.n = rounds
        self.bar.set_postfix_str(shown)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Failure(Exception):
    """Why an attempt ended badly: a message naming the culprit (with its log tail)."""


class Interrupted(Exception):
    pass


class Supervisor:
    """Runs the plan on a backend until the workers are done, it fails, or it is interrupted.

    ``run`` returns the exit code: 0 done, 1 failed (named), 130 interrupted. ``on_restart(n)``
    returns the plan of the n-th whole-cluster restart (after preparing the folder to resume);
    ``state_view()`` returns the state server's view of the job as text, for stall reports.
    """

    def __init__(self, backend: Backend, proc_dir: Path, mode_dir: Path, options: Options, *,
                 progress: RoundProgress | None = None,
                 on_restart: Callable[[int], list[RoleSpec]] | None = None,
                 state_view: Callable[[], str] | None = None, out=None):
        self.backend, self.proc_dir, self.options = backend, Path(proc_dir), options
        self.rounds = RoundWatch(mode_dir)
        self.progress, self.on_restart, self.state_view = progress, on_restart, state_view
        self.out = out or sys.stderr
        self.handles: list[Handle] = []
        self.state_restarts = 0
        self._ended: dict[int, float] = {}
        self.signalled: int | None = None
        self._stopping = False

    # -- the whole run ------------------------------------------------------------------------
    def run(self, specs: list[RoleSpec]) -> int:
        previous = self._catch_signals()
        try:
            return self._run(specs)
        except (KeyboardInterrupt, Interrupted):
            self._close_progress()
            self.say("\nesync-cluster: interrupted; stopping every process")
            self._stop_all()
            return 130
        finally:
            self._close_progress()
            self._stop_all()
            self.backend.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self, specs: list[RoleSpec]) -> int:
        attempt = 0
        while True:
            if self.signalled:
                raise Interrupted()
            self.handles, self.state_restarts, self._ended = [], 0, {}
            self.handles = self.backend.start(specs, self.proc_dir)
            try:
                self._watch()
            except Failure as failure:
                self._stop_all()
                self.say(str(failure))
                if self.signalled:
                    raise Interrupted() from None
                if attempt >= self.options.restarts or self.on_restart is None:
                    return 1
                attempt += 1
                self.say(f"esync-cluster: restarting the whole cluster from the last checkpoint "
                         f"(restart {attempt}/{self.options.restarts})")
                try:
                    specs = self.on_restart(attempt)
                except (RuntimeError, OSError) as exc:
                    self.say(f"esync-cluster: cannot restart: {exc}")
                    return 1
                continue
            return self._finish()

    # -- watching one attempt -----------------------------------------------------------------
    def _watch(self) -> None:
        """Returns when every worker has exited 0; raises Failure on a death or a stall."""
        workers = [h.spec for h in self.handles if h.kind == "worker"]
        stall = StallWatch(self.options.stall_timeout, self.options.startup_timeout,
                           time.monotonic())
        next_scan = 0.0
        while True:
            self._restart_state_server()
            failed = self._first_failure()
            if failed is not None:
                # A worker's death often makes the server abort a moment later (or the other way
                # round): look again shortly and name the root cause, a worker if any.
                time.sleep(1.0)
                raise Failure(self._death_report(self._first_failure() or failed))
            if all(h.poll() == 0 for h in self.handles if h.kind == "worker"):
                if self.progress:
                    self.progress.update(self._rounds_done(workers), final=True)
                return
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + 1.0
                scan = self.rounds.scan(workers)
                stall.observe(scan, now)
                if self.progress:
                    self.progress.update(max((c for c, _ in scan.values()), default=0))
                if stall.stalled(now):
                    raise Failure(self._stall_report(stall, scan, now))
            time.sleep(self.options.poll_seconds)

    def _rounds_done(self, workers) -> int:
        return max((c for c, _ in self.rounds.scan(workers).values()), default=0)

    def _workers_running(self) -> bool:
        return any(h.poll() is None for h in self.handles if h.kind == "worker")

    def _first_failure(self) -> Handle | None:
        """A process that failed, or a service that ended while workers still need it.

        Scheduler and servers end by themselves once every worker has said goodbye, which can be
        a moment before the last worker process is gone: only SERVICE_GRACE seconds later with
        workers still running is that a failure (the workers would otherwise wait forever).
        """
        running = self._workers_running()
        now = time.monotonic()
        failed = []
        for order, handle in enumerate(self.handles):
            code = handle.poll()
            if code is None:
                continue
            ended = self._ended.setdefault(id(handle), now)
            if code != 0 or (handle.kind in SERVICES and running
                             and now - ended > SERVICE_GRACE):
                failed.append((code, ended, order, handle))
        if not failed:
            return None
        # The cause, not its consequences: a process killed by a signal before those that
        # exited with an error (over the allreduce, the peers of a dead worker fail at their
        # next exchange), the first to end, workers before services (a server that aborts is
        # usually the consequence of a worker's death).
        return min(failed, key=lambda f: (f[0] is None or f[0] >= 0, f[1],
                                          f[3].kind not in ("worker", "evaluator"), f[2]))[3]

    def _restart_state_server(self) -> None:
        """Restart a state server that died mid-job, in place (same port, token and database).

        Workers retry their calls and the server rebuilds the job from SQLite, so a restart
        costs the job a pause, not its life. After ``state_restarts`` restarts the death counts
        as a failure like any other.
        """
        for i, handle in enumerate(self.handles):
            if handle.kind != "state" or handle.poll() is None:
                continue
            if self.state_restarts >= self.options.state_restarts or not self._workers_running():
                return
            self.state_restarts += 1
            self.say(f"esync-cluster: the state server died ({_why(handle.poll())}); restarting "
                     f"it ({self.state_restarts}/{self.options.state_restarts})")
            handle.terminate(hard=True)          # its gunicorn worker, if still there
            try:
                self.handles[i] = self.backend.start([handle.spec], self.proc_dir)[0]
            except (NotImplementedError, RuntimeError, OSError) as exc:
                self.say(f"esync-cluster: restarting the state server failed: {exc}")
                self.state_restarts = self.options.state_restarts

    # -- reports ------------------------------------------------------------------------------
    def _death_report(self, handle: Handle) -> str:
        return (f"esync-cluster: {handle.name} died ({_why(handle.poll())}); stopped the other "
                f"processes.\n--- last lines of {handle.log or handle.name} ---\n{handle.tail()}")

    def _stall_report(self, stall: StallWatch, scan, now: float) -> str:
        quiet_for = now - stall.last_progress
        lines = [f"esync-cluster: stalled: no worker finished a round for {quiet_for:.0f} s "
                 f"(stall timeout {stall.limit():.0f} s); stopping every process."]
        alive = [h for h in self.handles if h.poll() is None]
        tails = {h.name: h.tail() for h in alive}

        # The likeliest culprit first: a stopped process, one whose log shows an error (stuck on
        # its way out), then the worker idle the longest.
        def rank(h):
            stopped = "stopped" in h.describe()
            errored = any(word in tails[h.name] for word in ("Traceback", "Error"))
            idle = stall.idle(h.name, now) if h.kind == "worker" else -1.0
            return (not stopped, not errored, h.kind != "worker", -idle)
        lines.append("stuck processes (likeliest cause first):")
        for h in sorted(alive, key=rank):
            what = h.describe() or "running"
            if h.kind == "worker":
                count = scan.get(h.name, (0, 0.0))[0]
                what += (f"; {count} rounds logged, the last {stall.idle(h.name, now):.0f} s ago"
                         if count else "; no round logged yet")
            lines.append(f"  {h.name}: {what}")
        if self.state_view is not None and any(h.kind == "state" for h in self.handles):
            lines.append("the state server's view of the workers:")
            lines.append(self.state_view())
        for h in sorted(alive, key=rank)[:1]:
            lines.append(f"--- last lines of {h.log or h.name} ---\n{tails[h.name]}")
        return "\n".join(lines)

    # -- the end ------------------------------------------------------------------------------
    def _finish(self) -> int:
        """Workers are done: let scheduler, servers and evaluator end by themselves."""
        deadline = time.monotonic() + FINISH_TIMEOUT
        for handle in self.handles:
            if handle.kind not in ("scheduler", "server", "evaluator"):
                continue
            limit = deadline if handle.kind == "evaluator" else min(
                deadline, time.monotonic() + SERVICE_GRACE)
            while handle.poll() is None and time.monotonic() < limit:
                time.sleep(self.options.poll_seconds)
            if handle.poll() is None:
                self.say(f"esync-cluster: {handle.name} did not exit; stopping it")
        self._stop_all()
        for handle in self.handles:
            code = handle.poll()
            if handle.kind == "evaluator" and code is not None and code > 0:
                self.say(self._death_report(handle))
                return 1
        return 0

    def _stop_all(self) -> None:
        """SIGTERM to every process, SIGKILL to what is left after STOP_GRACE seconds, then to
        every process group (leftover children). A signal meanwhile does not cut this short."""
        self._stopping = True
        try:
            for handle in self.handles:
                if handle.poll() is None:
                    handle.terminate()
            deadline = time.monotonic() + STOP_GRACE
            while (any(h.poll() is None for h in self.handles)
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            for handle in self.handles:
                handle.terminate(hard=True)
        finally:
            self._stopping = False

    def _catch_signals(self) -> dict:
        """Stop on SIGINT, SIGTERM and SIGHUP, except those ignored on purpose (``nohup``, a
        background job of a script); only the main thread can set handlers."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) != signal.SIG_IGN:
                previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    def _on_signal(self, signum, frame) -> None:
        self.signalled = signum
        if not self._stopping:
            raise KeyboardInterrupt

    def _close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def _why(code: int | None) -> str:
    if code is None:
        return "still running"
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by signal {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"
