"""The ESync state server's decisions: how long each worker keeps computing locally in a round.

Plain Python with an injected clock, so every branch is testable without HTTP; the Django views
of ``state_server/`` only parse, validate, call this module and serialise (see
``docs/ALGORITHM.md``).

Two policies, chosen per job at ``init``:

``dynamic`` (the original ESync, one request before every local iteration)
    ``JobState.apply(rank, k, c)`` follows the pseudo-code: record ``k_i``, ``c_i`` and
    ``seen_i`` (the *server's* receive time; worker timestamps are never used, so clocks need not
    agree), then answer "not ready" when ``k_i == 0`` or when the slowest worker ``s`` (largest
    ``c``) has not started the current round, and "ready" when ``i == s``, when ``s`` is already
    ready, or when ``c_i + slack_i > remaining`` with ``remaining = c_s - (now - seen_s)``.
    "Has not started" also covers a slowest worker that entered the round but has not reported in
    it yet: its ``seen`` then dates from the previous round and ``remaining`` would be meaningless.

``planned`` (new: one request per worker per round)
    ``JobState.plan(rank, c)`` is called once at the start of a round and returns
    ``k_i = max(1, floor((c_s - slack_i) / c_i))`` from the latest known ``c`` of every worker;
    the slowest worker itself, and everyone while some worker's ``c`` is still unknown, get 1.

The slack
---------
A number given at ``init`` is the original's absolute ``epsilon`` in seconds, unchanged (the
original's default was 0.5 s, which turns ESync into SSGD as soon as an iteration takes less than
0.5 s: ``c_i + 0.5 > remaining`` always holds).

The default, ``"auto"``, is scale-free::

    slack_i = (o_i - o_s) - c_i / N

``o_i`` is worker i's *per-iteration overhead*, measured on the server's own clock: between two
consecutive reports of one round (``k`` going up by one) the worker spent ``now - seen_i``, of
which ``c`` was the iteration it reports, so ``o = max(0, now - seen_i - c)`` (request round trip,
batch loading, anything outside ``c``); it is smoothed with an exponential moving average.
Why these two terms:

* Overheads.  Worker i, told "not ready" now, reports again at ``now + c_i + o_i``; the slowest
  reports its finished iteration at ``seen_s + c_s + o_s``.  Aggregation starts when both have
  reported, so one more iteration fits iff ``c_i + o_i - o_s <= remaining``.  On a uniform network
  the overheads cancel; a worker on a slower link (or with slower batch loading) stops earlier.
* ``- c_i / N``.  Timings are noisy, so the last iteration that "fits" may overshoot a little.
  Stopping early idles one worker for (up to) ``c_i``; overshooting by ``x`` idles the other
  ``N - 1`` workers for ``x``.  One more iteration pays off iff ``(N - 1) x < c_i - x``, i.e.
  ``x < c_i / N``: so a predicted overshoot below ``c_i / N`` is accepted.  With the planned
  policy this makes ``k_i = floor(c_s / c_i + 1 / N)``: a worker measured 1.97 times faster than
  the slowest does 2 iterations, not 1 (plain flooring would waste half its time on noise).

Both terms scale with the iteration time and the measured latency, so the rule behaves the same
for 5 ms and 5 s iterations.  Overheads are only measurable from per-iteration reports, so under
the planned policy they are 0 unless the worker also reported per iteration.

History
-------
When a worker enters a new round, its record of the round it leaves is closed: ``k`` (iterations
reported, or the planned ``k``), ``c`` (last duration), ``compute`` (sum of the reported durations;
``k * c`` under the planned policy) and ``wait`` (time in the round on the server's clock minus
``compute``: aggregation, waiting for the others, requests).  ``enter_round`` returns it so that
the caller can persist it.

Every public method of ``JobState`` holds the job's lock: the state server runs threaded.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable

POLICIES = ("dynamic", "planned")
AUTO = "auto"

# Limits of accepted values: anything beyond is a client bug, rejected before it touches state.
MAX_WORKERS = 4096
MAX_K = 10_000_000          # local iterations in one round
MAX_C = 86_400.0            # seconds per local iteration
MAX_ROUND = 1_000_000_000
MAX_EPSILON = 3_600.0       # seconds of absolute slack
MAX_PLANNED_K = 1_000_000   # cap on a planned k (c_s / c_i with a near-zero c_i)
OVERHEAD_SMOOTHING = 0.25   # weight of the newest sample in the overhead moving average
HISTORY_IN_MEMORY = 10_000  # records kept in memory per job (the state server also persists them)

ERR_NUM_WORKERS = f"num_workers must be an integer in [1, {MAX_WORKERS}]"
ERR_EPSILON = f"epsilon must be 'auto' or a number of seconds in [0, {MAX_EPSILON:g}]"
ERR_POLICY = "policy must be one of: " + ", ".join(POLICIES)
ERR_RANK = "r (the worker's rank) must be an integer in [0, {num_workers})"
ERR_K = f"k (local iterations done this round) must be an integer in [0, {MAX_K}]"
ERR_C = f"c (duration of the last local iteration) must be a number of seconds in [0, {MAX_C:g}]"
ERR_ROUND = f"t (the round entered) must be an integer in [1, {MAX_ROUND}]"
ERR_WRONG_POLICY_APPLY = "this job uses the 'planned' policy: call plan, not apply"
ERR_WRONG_POLICY_PLAN = "this job uses the 'dynamic' policy: call apply, not plan"


class PolicyError(ValueError):
    """A rejected call; ``field`` names the offending input. State is unchanged."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.message = message
        self.field = field


class PolicyMismatch(PolicyError):
    """``apply`` on a planned job or ``plan`` on a dynamic one."""


def check_int(value, *, low: int, high: int, message: str, field: str) -> int:
    """``value`` as an int in [low, high], or PolicyError (bools are not integers)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PolicyError(message, field)
    return value


def check_float(value, *, low: float, high: float, message: str, field: str) -> float:
    """``value`` as a finite float in [low, high], or PolicyError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(message, field)
    value = float(value)
    if not math.isfinite(value) or not low <= value <= high:
        raise PolicyError(message, field)
    return value


def check_epsilon(value) -> float | str:
    """``"auto"`` or absolute seconds."""
    if value == AUTO:
        return AUTO
    return check_float(value, low=0.0, high=MAX_EPSILON, message=ERR_EPSILON, field="epsilon")


def check_policy(value) -> str:
    if value not in POLICIES:
        raise PolicyError(ERR_POLICY, "policy")
    return value


@dataclass
class RoundRecord:
    """One worker's closed round, on the server's clock."""

    round: int
    rank: int
    k: int
    c: float
    compute: float
    wait: float

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class RoundEntry:
    """What ``enter_round`` did: the closed record (if any) and whether a new round began."""

    record: RoundRecord | None
    new_round: bool
    current_round: int


@dataclass
class _Worker:
    # The decision state of docs/ALGORITHM.md.
    k: int = 0
    c: float = 0.0
    seen: float | None = None
    ready: bool = False
    round: int = 1
    # Whether it reported since entering its round (its `seen` belongs to this round).
    started: bool = False
    # Overhead measurement (server clock).
    overhead: float | None = None
    # Accounting of the worker's own current round, for the history.
    round_start: float | None = None
    round_k: int = 0
    round_compute: float = 0.0
    planned_k: int | None = None
    requests: int = 0


class JobState:
    """The live state of one job: every worker's k, c, seen, ready, round; thread-safe."""

    def __init__(self, *, num_workers: int, epsilon: float | str = AUTO, policy: str = "dynamic",
                 clock: Callable[[], float] = time.monotonic, current_round: int = 1,
                 name: str = "default"):
        self.num_workers = check_int(num_workers, low=1, high=MAX_WORKERS,
                                     message=ERR_NUM_WORKERS, field="num_workers")
        self.epsilon = check_epsilon(epsilon)
        self.policy = check_policy(policy)
        self.current_round = check_int(current_round, low=1, high=MAX_ROUND,
                                       message=ERR_ROUND, field="round")
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._workers = [_Worker(round=self.current_round) for _ in range(self.num_workers)]
        self.history: deque[RoundRecord] = deque(maxlen=HISTORY_IN_MEMORY)

    # -- the policies ---------------------------------------------------------------------

    def apply(self, rank: int, k: int, c: float) -> bool:
        """Dynamic policy: is worker ``rank`` (``k`` iterations done, last one ``c`` s) ready?"""
        rank, k, c = self._check_report(rank, k, c)
        if self.policy != "dynamic":
            raise PolicyMismatch(ERR_WRONG_POLICY_APPLY, "policy")
        with self._lock:
            now = self._clock()
            me = self._workers[rank]
            self._record_report(me, k, c, now)
            if k == 0:
                return False                              # everyone computes at least once
            s = self._slowest()
            slow = self._workers[s]
            if slow.round != self.current_round or not slow.started:
                return False                              # the slowest has not started this round
            remaining = slow.c - (now - slow.seen)
            if rank == s or slow.ready or c + self._slack(rank, s) > remaining:
                me.ready = True
                return True
            return False                                  # one more iteration fits

    def plan(self, rank: int, c: float) -> int:
        """Planned policy: local iterations for worker ``rank`` this round (last duration ``c``)."""
        rank = self._check_rank(rank)
        c = check_float(c, low=0.0, high=MAX_C, message=ERR_C, field="c")
        if self.policy != "planned":
            raise PolicyMismatch(ERR_WRONG_POLICY_PLAN, "policy")
        with self._lock:
            now = self._clock()
            me = self._workers[rank]
            me.requests += 1
            if c > 0:
                me.c = c
            me.seen = now
            me.started = True
            if me.round_start is None:
                me.round_start = now
            me.planned_k = self._planned_k(rank)
            return me.planned_k

    def enter_round(self, rank: int, t: int) -> RoundEntry:
        """Worker ``rank`` tells that it now enters round ``t``; closes its previous round."""
        rank = self._check_rank(rank)
        t = check_int(t, low=1, high=MAX_ROUND, message=ERR_ROUND, field="t")
        with self._lock:
            now = self._clock()
            me = self._workers[rank]
            me.requests += 1
            new_round = t > self.current_round
            if new_round:
                self.current_round = t
                for worker in self._workers:
                    worker.k = 0
                    worker.ready = False
            record = None
            if t != me.round:
                record = self._close_round(rank, me, now)
                me.round_k, me.round_compute, me.planned_k = 0, 0.0, None
                me.round_start = now
                me.started = False
            me.round = t
            return RoundEntry(record=record, new_round=new_round, current_round=self.current_round)

    # -- reading ----------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """The whole state as JSON-ready data (ages instead of raw clock values)."""
        with self._lock:
            now = self._clock()
            s = self._slowest()
            workers = []
            for rank, w in enumerate(self._workers):
                workers.append({
                    "rank": rank, "k": w.k, "c": w.c, "ready": w.ready, "round": w.round,
                    "seen_ago": None if w.seen is None else round(now - w.seen, 6),
                    "overhead": w.overhead, "planned_k": w.planned_k, "requests": w.requests,
                    "slack": self._slack(rank, s) if w.c > 0 else None,
                })
            return {"job": self.name, "policy": self.policy, "epsilon": self.epsilon,
                    "num_workers": self.num_workers, "round": self.current_round,
                    "slowest": s, "workers": workers}

    def history_records(self) -> list[dict]:
        with self._lock:
            return [record.as_dict() for record in self.history]

    # -- internals (called with the lock held) ----------------------------------------------

    def _check_rank(self, rank) -> int:
        return check_int(rank, low=0, high=self.num_workers - 1, field="r",
                         message=ERR_RANK.format(num_workers=self.num_workers))

    def _check_report(self, rank, k, c) -> tuple[int, int, float]:
        rank = self._check_rank(rank)
        k = check_int(k, low=0, high=MAX_K, message=ERR_K, field="k")
        c = check_float(c, low=0.0, high=MAX_C, message=ERR_C, field="c")
        return rank, k, c

    def _record_report(self, me: _Worker, k: int, c: float, now: float) -> None:
        me.requests += 1
        if me.started and me.seen is not None and k == me.round_k + 1:
            sample = max(0.0, (now - me.seen) - c)
            me.overhead = sample if me.overhead is None else (
                (1 - OVERHEAD_SMOOTHING) * me.overhead + OVERHEAD_SMOOTHING * sample)
        if k > me.round_k:
            me.round_compute += c if k == me.round_k + 1 else c * (k - me.round_k)
            me.round_k = k
        if me.round_start is None:
            me.round_start = now
        me.k, me.c, me.seen, me.started = k, c, now, True

    def _slowest(self) -> int:
        """Rank with the largest c (lowest rank on ties)."""
        best = 0
        for rank, worker in enumerate(self._workers):
            if worker.c > self._workers[best].c:
                best = rank
        return best

    def _slack(self, rank: int, s: int) -> float:
        if self.epsilon != AUTO:
            return self.epsilon
        mine = self._workers[rank].overhead or 0.0
        theirs = self._workers[s].overhead or 0.0
        return (mine - theirs) - self._workers[rank].c / self.num_workers

    def _planned_k(self, rank: int) -> int:
        if any(worker.c <= 0 for worker in self._workers):
            return 1                                      # someone has never reported a duration
        s = self._slowest()
        if rank == s:
            return 1
        c_s, c_i = self._workers[s].c, self._workers[rank].c
        k = math.floor((c_s - self._slack(rank, s)) / c_i + 1e-9)
        return max(1, min(MAX_PLANNED_K, k))

    def _close_round(self, rank: int, me: _Worker, now: float) -> RoundRecord | None:
        if me.round_start is None:
            return None                                   # never active in that round
        if me.planned_k is not None:
            k, compute = me.planned_k, me.planned_k * me.c
        else:
            k, compute = me.round_k, me.round_compute
        wait = max(0.0, (now - me.round_start) - compute)
        record = RoundRecord(round=me.round, rank=rank, k=k, c=me.c,
                             compute=round(compute, 6), wait=round(wait, 6))
        self.history.append(record)
        return record


class JobRegistry:
    """Live jobs by name, created and replaced under one lock (each job has its own lock)."""

    def __init__(self):
        self._jobs: dict[str, JobState] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> JobState | None:
        with self._lock:
            return self._jobs.get(name)

    def put(self, job: JobState) -> JobState:
        """Install ``job``, replacing any job of the same name (a new ``init``)."""
        with self._lock:
            self._jobs[job.name] = job
            return job

    def setdefault(self, job: JobState) -> JobState:
        """Install ``job`` unless one of that name exists; return the installed one."""
        with self._lock:
            return self._jobs.setdefault(job.name, job)

    def clear(self) -> None:
        with self._lock:
            self._jobs.clear()

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)
