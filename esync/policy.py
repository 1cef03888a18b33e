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
    it yet: its ``seen`` then dates from the previous round and ``remaining`` would be meaningless
    (unless it is already ready: after a restart it will not report again in this round).

    The lease (``JobState.decide``): a "not ready" answer also says for how long the rule will
    keep saying it, ``budget = remaining - slack_i`` (before the slowest has started, its whole
    last ``c_s`` minus the slack: it starts after now). Any iteration the worker starts within
    ``budget - c_i`` of the answer would be told "not ready", so the trainer does not ask for
    it; it asks when the lease runs out, and the server, not the worker, says "ready". A fast
    worker asks twice per round (after its first iteration, which also enters the round, and
    once at the end) instead of before each iteration (``esync.state_client.ReadinessAsker``).
    The worker counts the lease from the answer's arrival (the budget was computed after the
    call's wait in the server's queue, which under load is most of a call), so a lease is too
    long for the rule as it stood by at most the answer's transit back (a worker that may be the
    slowest waits for its k = 0 answer before computing, so it starts after the server saw it);
    if the slowest then finishes early, the worker runs on for at most the difference.

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

One report per round (``JobState.report_round``, the planned policy without HTTP on the
critical path)
    After round t's parameter exchange, rank 0 reports every worker's ``k`` and ``c`` of round t in
    one call and gets back the plan of every worker for the next round it can influence.  The plan
    is ``plan_round``, the same pure function ``plan`` uses, so both give the same ``k_i`` for the
    same durations.

Idempotency
-----------
Every state-changing call may be retried (a request whose answer was lost).  Rounds only move
forward: ``enter_round(rank, t)`` with ``t`` below the worker's round changes nothing; ``apply``
and ``plan`` take an optional ``t`` (the caller's round: older is ignored, newer enters it first);
``report_round(t, ...)`` for a round already reported answers the plan it gave then.  ``k`` is
a count of the round so far, so a repeated ``apply`` does not count an iteration twice.

Persistence
-----------
``worker_states``/``restore`` give and take each worker's persistent state (round, k, c, ready,
planned k, overhead, the round's accounting); ``take_changes`` hands the caller what changed
since the last call (dirty workers, closed rounds, round reports), so the state server writes
exactly that before it acknowledges a round change.

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
ERR_WRONG_POLICY_ROUNDS = ("this job uses the 'dynamic' policy: report rounds only on a job "
                           "initialised with policy 'planned'")
ERR_ROUND_K = ("k must be a list of num_workers ({num_workers}) integers in [0, "
               f"{MAX_K}]: the local iterations of every worker in round t")
ERR_ROUND_C = ("c must be a list of num_workers ({num_workers}) numbers of seconds in [0, "
               f"{MAX_C:g}]: every worker's last local-iteration duration in round t")
MAX_BATCH = 64              # round reports in one call (a reporter catching up)
ERR_BATCH = f"rounds must be a list of 1 to {MAX_BATCH} objects {{t, k, c}}"
PLANS_KEPT = 64             # answered plans remembered per job, to answer a repeated report

PERSISTED_FIELDS = ("round", "k", "c", "ready", "planned_k", "overhead", "round_k",
                    "round_compute")


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
    try:
        value = float(value)
    except OverflowError:                                 # an integer too large for a float
        raise PolicyError(message, field) from None
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


# -- the planned policy as pure functions (shared by ``plan`` and ``report_round``) ----------------

def slowest_rank(durations) -> int:
    """Rank with the largest duration (lowest rank on ties)."""
    best = 0
    for rank, c in enumerate(durations):
        if c > durations[best]:
            best = rank
    return best


def slack_of(epsilon: float | str, *, c_i: float, num_workers: int, overhead_i: float = 0.0,
             overhead_s: float = 0.0) -> float:
    """Worker i's slack: absolute ``epsilon``, or the module docstring's automatic slack."""
    if epsilon != AUTO:
        return epsilon
    return (overhead_i - overhead_s) - c_i / num_workers


def planned_k(c_i: float, c_s: float, slack_i: float) -> int:
    """Iterations of duration ``c_i`` that fit in the slowest's ``c_s`` given ``slack_i``."""
    k = math.floor((c_s - slack_i) / c_i + 1e-9)
    return max(1, min(MAX_PLANNED_K, k))


def plan_for(rank: int, durations, *, epsilon: float | str, overheads=None) -> int:
    """The planned policy's k for ``rank`` given every worker's latest duration (0: unknown)."""
    if any(c <= 0 for c in durations):
        return 1                                          # someone has never reported a duration
    s = slowest_rank(durations)
    return _plan_rank(rank, s, durations, epsilon=epsilon, overheads=overheads)


def plan_round(durations, *, epsilon: float | str, overheads=None) -> list[int]:
    """``plan_for`` of every rank at once (O(N))."""
    if any(c <= 0 for c in durations):
        return [1] * len(durations)
    s = slowest_rank(durations)
    return [_plan_rank(rank, s, durations, epsilon=epsilon, overheads=overheads)
            for rank in range(len(durations))]


def _plan_rank(rank: int, s: int, durations, *, epsilon, overheads) -> int:
    if rank == s:
        return 1
    overhead_i = (overheads[rank] or 0.0) if overheads else 0.0
    overhead_s = (overheads[s] or 0.0) if overheads else 0.0
    slack = slack_of(epsilon, c_i=durations[rank], num_workers=len(durations),
                     overhead_i=overhead_i, overhead_s=overhead_s)
    return planned_k(durations[rank], durations[s], slack)


@dataclass(frozen=True)
class Decision:
    """The dynamic policy's answer. ``budget`` (s) qualifies a "not ready": by the server's
    clock, this worker would keep being told "not ready" for every iteration it starts within
    ``budget - c`` seconds of this answer (as long as no report changes who is the slowest), so
    it need not ask again before then. 0: ask before the next iteration."""
    ready: bool
    budget: float = 0.0


READY, NOT_READY = Decision(True), Decision(False)


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
    stale: bool = False          # t was older than the worker's round: nothing changed


@dataclass
class RoundReport:
    """What ``report_round`` answered: the plan for the next round and whether it was new."""

    t: int
    plan: list[int]
    duplicate: bool
    records: list[RoundRecord]


@dataclass
class Changes:
    """What changed since the last ``take_changes``: what the state server must persist."""

    current_round: int
    workers: dict[int, dict]
    records: list[RoundRecord]
    reports: list[tuple[int, list[int]]]
    last_report_t: int

    def __bool__(self) -> bool:
        return bool(self.workers or self.records or self.reports)


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
        self.run = 1                # which run of the job (the state server counts inits)
        self.storage_id = None      # the caller's key for this job in its storage
        self._clock = clock
        self._lock = threading.Lock()
        self._workers = [_Worker(round=self.current_round) for _ in range(self.num_workers)]
        self.history: deque[RoundRecord] = deque(maxlen=HISTORY_IN_MEMORY)
        # Round reports (report_round): the last reported round, the plans answered, and when
        # the last report arrived (a round's duration on the server's clock).
        self.last_report_t = 0
        self._plans: dict[int, list[int]] = {}
        self._last_report_at: float | None = None     # unknown before the first report
        # Changes not yet taken by the persisting caller.
        self._dirty: set[int] = set()
        self._new_records: list[RoundRecord] = []
        self._new_reports: list[tuple[int, list[int]]] = []
        self._round_changed = False

    # -- the policies ---------------------------------------------------------------------

    def apply(self, rank: int, k: int, c: float, t: int | None = None) -> bool:
        """Dynamic policy: is worker ``rank`` (``k`` iterations done, last one ``c`` s) ready?

        ``t`` (optional, the caller's round): a report of an older round changes nothing and
        answers ready; a newer round is entered first.
        """
        return self.decide(rank, k, c, t).ready

    def decide(self, rank: int, k: int, c: float, t: int | None = None) -> Decision:
        """``apply`` with the lease: how long this "not ready" answer stays true (``Decision``)."""
        rank, k, c = self._check_report(rank, k, c)
        t = self._check_optional_round(t)
        if self.policy != "dynamic":
            raise PolicyMismatch(ERR_WRONG_POLICY_APPLY, "policy")
        with self._lock:
            now = self._clock()
            me = self._workers[rank]
            if t is not None and t < me.round:
                return READY                              # a late retry of a finished round
            if t is not None and t > me.round:
                # A fast worker's first call comes after its first k iterations: its round
                # began about k * c ago (for the compute-versus-wait accounting).
                self._enter(rank, t, now - k * c, durable=False)
            self._record_report(me, k, c, now)
            self._dirty.add(rank)
            s = self._slowest()
            slow = self._workers[s]
            in_round = slow.round == self.current_round
            if in_round and (rank == s or slow.ready):
                # k = 0: everyone computes at least once
                return self._become_ready(me) if k > 0 else NOT_READY
            if rank == s:
                return NOT_READY
            lease = slow.c - self._slack(rank, s)
            if not in_round or not slow.started:
                # The slowest has not started this round (or not reported in it): not ready.
                # It starts after now, so its iteration ends at least c_s from now.
                return Decision(False, max(0.0, lease))
            budget = lease - (now - slow.seen)            # remaining - slack
            if k == 0:
                return Decision(False, max(0.0, budget))  # everyone computes at least once
            if c > budget:
                return self._become_ready(me)
            return Decision(False, budget)                # one more iteration fits

    def plan(self, rank: int, c: float, t: int | None = None) -> int:
        """Planned policy: local iterations for worker ``rank`` this round (last duration ``c``).

        ``t`` as in ``apply``: an older round answers the k planned then, unchanged.
        """
        rank = self._check_rank(rank)
        c = check_float(c, low=0.0, high=MAX_C, message=ERR_C, field="c")
        t = self._check_optional_round(t)
        if self.policy != "planned":
            raise PolicyMismatch(ERR_WRONG_POLICY_PLAN, "policy")
        with self._lock:
            now = self._clock()
            me = self._workers[rank]
            if t is not None and t < me.round:
                return me.planned_k or 1
            if t is not None and t > me.round:
                self._enter(rank, t, now)
            me.requests += 1
            if c > 0:
                me.c = c
            me.seen = now
            me.started = True
            if me.round_start is None:
                me.round_start = now
            me.planned_k = plan_for(rank, [w.c for w in self._workers], epsilon=self.epsilon,
                                    overheads=[w.overhead for w in self._workers])
            self._dirty.add(rank)
            return me.planned_k

    def enter_round(self, rank: int, t: int) -> RoundEntry:
        """Worker ``rank`` tells that it now enters round ``t``; closes its previous round.

        Rounds only move forward: ``t`` at or below the worker's round changes nothing.
        """
        rank = self._check_rank(rank)
        t = check_int(t, low=1, high=MAX_ROUND, message=ERR_ROUND, field="t")
        with self._lock:
            me = self._workers[rank]
            me.requests += 1
            if t <= me.round:
                return RoundEntry(record=None, new_round=False, current_round=self.current_round,
                                  stale=t < me.round)
            new_round = t > self.current_round
            record = self._enter(rank, t, self._clock())
            return RoundEntry(record=record, new_round=new_round, current_round=self.current_round)

    def report_round(self, t: int, ks, cs) -> RoundReport:
        """Every worker's ``k`` and ``c`` of round ``t`` at once; the plan for the next round.

        Called by rank 0 after round t's exchange. Enters every worker into round t + 1, closes
        round t for each, and plans with ``plan_round``. A repeated report of a round already
        reported changes nothing and answers the plan given then (or the newest one).
        """
        return self.report_rounds([(t, ks, cs)])

    def report_rounds(self, reports) -> RoundReport:
        """Several ``(t, ks, cs)`` reports in order (a reporter catching up); the last answer.

        Every report is checked before any is applied, so a bad one changes nothing.
        """
        if not isinstance(reports, (list, tuple)) or not 1 <= len(reports) <= MAX_BATCH:
            raise PolicyError(ERR_BATCH, "rounds")
        checked = [self._check_round_report(*report) for report in reports]
        if self.policy != "planned":
            raise PolicyMismatch(ERR_WRONG_POLICY_ROUNDS, "policy")
        answer = None
        for t, ks, cs in checked:
            answer = self._report_round(t, ks, cs)
        return answer

    def _check_round_report(self, t, ks, cs) -> tuple[int, list, list]:
        t = check_int(t, low=1, high=MAX_ROUND - 1, message=ERR_ROUND, field="t")
        ks = self._check_vector(ks, ERR_ROUND_K, "k", integer=True)
        cs = self._check_vector(cs, ERR_ROUND_C, "c", integer=False)
        return t, ks, cs

    def _report_round(self, t: int, ks: list, cs: list) -> RoundReport:
        with self._lock:
            if t <= self.last_report_t:
                kept = t if t in self._plans else self.last_report_t
                return RoundReport(t=kept, plan=list(self._plans.get(kept) or
                                                     [1] * self.num_workers),
                                   duplicate=True, records=[])
            now = self._clock()
            since = None if self._last_report_at is None else now - self._last_report_at
            records = []
            for rank, (k, c) in enumerate(zip(ks, cs)):
                me = self._workers[rank]
                me.requests += 1
                if c > 0:
                    me.c = c
                me.k, me.seen, me.started = k, now, True
                compute = k * c
                record = RoundRecord(round=t, rank=rank, k=k, c=c, compute=round(compute, 6),
                                     wait=round(max(0.0, since - compute), 6)
                                     if since is not None else 0.0)
                records.append(record)
                me.round = max(me.round, t + 1)
                me.round_k, me.round_compute, me.ready = 0, 0.0, False
                me.round_start = now
            self.current_round = max(self.current_round, t + 1)
            plan = plan_round([w.c for w in self._workers], epsilon=self.epsilon)
            for me, k in zip(self._workers, plan):
                me.planned_k = k
            self.history.extend(records)
            self._new_records.extend(records)
            self.last_report_t = t
            self._last_report_at = now
            self._plans[t] = plan
            while len(self._plans) > PLANS_KEPT:
                del self._plans[min(self._plans)]
            self._new_reports.append((t, plan))
            self._dirty.update(range(self.num_workers))
            self._round_changed = True
            return RoundReport(t=t, plan=list(plan), duplicate=False, records=records)

    # -- persistence -------------------------------------------------------------------------

    def worker_states(self) -> list[dict]:
        """Every worker's persistent state (``PERSISTED_FIELDS``), by rank."""
        with self._lock:
            return [self._persisted(w) for w in self._workers]

    def restore(self, workers: dict[int, dict], *, last_report_t: int = 0,
                last_plan: list[int] | None = None) -> None:
        """Rebuild after a restart from ``worker_states`` rows (missing ranks keep defaults).

        The round's start is the restart time and every worker counts as not having reported in
        its round yet (its report time is unknown), so no decision uses a time from before.
        """
        with self._lock:
            now = self._clock()
            for rank, fields in workers.items():
                if not 0 <= rank < self.num_workers:
                    continue
                me = self._workers[rank]
                for name in PERSISTED_FIELDS:
                    if name in fields:
                        setattr(me, name, fields[name])
                me.round_start, me.started, me.seen = now, False, None
            self.current_round = max([self.current_round] + [w.round for w in self._workers])
            self.last_report_t = last_report_t
            if last_report_t and last_plan is not None and len(last_plan) == self.num_workers:
                self._plans[last_report_t] = list(last_plan)
            self._last_report_at = None                   # unknown: the next round's wait is 0

    def needs_persisting(self) -> bool:
        """Whether a round changed since the last ``take_changes`` (to write before answering)."""
        with self._lock:
            return self._round_changed

    def take_changes(self) -> Changes:
        """What changed since the last call, for the caller to persist; resets the tracking."""
        with self._lock:
            changes = Changes(current_round=self.current_round,
                              workers={rank: self._persisted(self._workers[rank])
                                       for rank in sorted(self._dirty)},
                              records=self._new_records, reports=self._new_reports,
                              last_report_t=self.last_report_t)
            self._dirty, self._new_records, self._new_reports = set(), [], []
            self._round_changed = False
            return changes

    def give_back(self, changes: Changes) -> None:
        """Undo a ``take_changes`` whose write failed: the changes are pending again."""
        with self._lock:
            self._dirty.update(changes.workers)
            self._new_records[:0] = changes.records
            self._new_reports[:0] = changes.reports
            self._round_changed = True

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
                    "last_reported_round": self.last_report_t,
                    "slowest": s, "workers": workers}

    def history_records(self) -> list[dict]:
        with self._lock:
            return [record.as_dict() for record in self.history]

    # -- internals (called with the lock held) ----------------------------------------------

    def _check_rank(self, rank) -> int:
        return check_int(rank, low=0, high=self.num_workers - 1, field="r",
                         message=ERR_RANK.format(num_workers=self.num_workers))

    @staticmethod
    def _check_optional_round(t) -> int | None:
        if t is None:
            return None
        return check_int(t, low=1, high=MAX_ROUND, message=ERR_ROUND, field="t")

    def _check_report(self, rank, k, c) -> tuple[int, int, float]:
        rank = self._check_rank(rank)
        k = check_int(k, low=0, high=MAX_K, message=ERR_K, field="k")
        c = check_float(c, low=0.0, high=MAX_C, message=ERR_C, field="c")
        return rank, k, c

    def _check_vector(self, values, message: str, field: str, *, integer: bool) -> list:
        message = message.format(num_workers=self.num_workers)
        if not isinstance(values, (list, tuple)) or len(values) != self.num_workers:
            raise PolicyError(message, field)
        if integer:
            return [check_int(v, low=0, high=MAX_K, message=message, field=field) for v in values]
        return [check_float(v, low=0.0, high=MAX_C, message=message, field=field)
                for v in values]

    @staticmethod
    def _persisted(worker: _Worker) -> dict:
        return {name: getattr(worker, name) for name in PERSISTED_FIELDS}

    def _enter(self, rank: int, t: int, now: float, *, durable: bool = True) -> RoundRecord | None:
        """Move worker ``rank`` forward into round ``t`` (> its round); the closed record.

        ``durable`` False: the entry need not be committed before the answer, only with the
        next commit (an ``apply`` carries its round, so a server that lost the entry in a
        restart is moved forward again by the worker's next call)."""
        me = self._workers[rank]
        if t > self.current_round:
            self.current_round = t
            for worker in self._workers:
                worker.k = 0
                worker.ready = False
            self._dirty.update(range(self.num_workers))
        record = self._close_round(rank, me, now)
        me.round_k, me.round_compute, me.planned_k = 0, 0.0, None
        me.round_start = now
        me.started = False
        me.round = t
        self._dirty.add(rank)
        self._round_changed = self._round_changed or durable
        if record is not None:
            self._new_records.append(record)
        return record

    def _become_ready(self, me: _Worker) -> Decision:
        """Tell ``me`` to aggregate. The first "ready" of a round must survive a restart (the
        worker will not ask again: it is in the exchange, where the others need it), so it
        asks the caller to persist before answering."""
        if not me.ready:
            me.ready = True
            self._round_changed = True
        return READY

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
        return slowest_rank([worker.c for worker in self._workers])

    def _slack(self, rank: int, s: int) -> float:
        return slack_of(self.epsilon, c_i=self._workers[rank].c, num_workers=self.num_workers,
                        overhead_i=self._workers[rank].overhead or 0.0,
                        overhead_s=self._workers[s].overhead or 0.0)

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
