"""One job's live state on the state server: every worker's k, c, round; history; persistence.

The decisions themselves are the pure rules of ``esync.coordination.rules``; this module keeps
the bookkeeping around them, thread-safe (every public method of ``JobState`` holds the job's
lock: the state server runs threaded).

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
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable

from esync.coordination.limits import (
    AUTO, COMM_SMOOTHING, ERR_BATCH, ERR_C, ERR_D, ERR_K, ERR_NUM_WORKERS, ERR_RANK, ERR_ROUND,
    ERR_ROUND_C, ERR_ROUND_D, ERR_ROUND_K, ERR_ROUND_O, ERR_WRONG_POLICY_APPLY, ERR_WRONG_POLICY_PLAN,
    ERR_WRONG_POLICY_ROUNDS, HISTORY_IN_MEMORY, MAX_BATCH, MAX_C, MAX_COMM, MAX_K, MAX_ROUND,
    MAX_WORKERS, OVERHEAD_SMOOTHING, PERSISTED_FIELDS, PLANS_KEPT, PolicyError, PolicyMismatch,
    check_epsilon, check_float, check_int, check_policy, check_sizing)
from esync.coordination.rules import (
    COMPUTE_ONLY, Decision, NOT_READY, READY, RoundSizing, bounded_length, plan_for, plan_round,
    round_length, sitting_out_ranks, slack_of, slowest_rank, transfer_estimate)

# In the first round a fast device asks again after this share of the time it has computed so
# far: the untimed device it waits for has computed at least as long, so the first exchange
# waits for the fast devices' last lease by at most this share of the slowest's iteration.
FIRST_ROUND_LEASE = 0.1


@dataclass
class ClosedRound:
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

    record: ClosedRound | None
    new_round: bool
    current_round: int
    stale: bool = False          # t was older than the worker's round: nothing changed


@dataclass
class RoundReport:
    """What ``report_round`` answered: the plan for the next round and whether it was new."""

    t: int
    plan: list[int]
    duplicate: bool
    records: list[ClosedRound]


@dataclass
class Changes:
    """What changed since the last ``take_changes``: what the state server must persist."""

    current_round: int
    workers: dict[int, dict]
    records: list[ClosedRound]
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
    # Communication time of its last exchange (smoothed; None: never reported).
    comm: float | None = None
    # The round from which it sits out (``rules.sitting_out_ranks``; 0: it takes part), told
    # with its "ready" of the round before.
    sit_out_from: int = 0
    # Its warm-up probe's c, from its first question (0: not asked yet, or lost in a restart):
    # a probe is judged against the others' probes (``_judged_too_slow``).
    probe: float = 0.0
    # The timing before its latest c (its probe before its first iteration; 0: none yet, or
    # lost in a restart).
    earlier_c: float = 0.0

    @property
    def pace(self) -> float:
        """The smaller of its latest two timings (0: untimed): what a sit-out is judged by,
        so that one stalled iteration (a loaded host, a pause) does not drop a device for good;
        a device truly too slow is so in every reading."""
        return min((c for c in (self.c, self.earlier_c) if c > 0), default=0.0)


@dataclass(frozen=True)
class _StretchedRound:
    """A round of the dynamic policy longer than the slowest's iteration: its T (``length``,
    a whole number of the slowest's iterations, ``rules.round_length``) and that number."""
    round: int
    length: float
    iterations: int


class JobState:
    """The live state of one job: every worker's k, c, seen, ready, round; thread-safe."""

    def __init__(self, *, num_workers: int, epsilon: float | str = AUTO, policy: str = "dynamic",
                 clock: Callable[[], float] = time.monotonic, current_round: int = 1,
                 name: str = "default", sizing: RoundSizing = COMPUTE_ONLY):
        self.num_workers = check_int(num_workers, low=1, high=MAX_WORKERS,
                                     message=ERR_NUM_WORKERS, field="num_workers")
        self.epsilon = check_epsilon(epsilon)
        self.policy = check_policy(policy)
        self.current_round = check_int(current_round, low=1, high=MAX_ROUND,
                                       message=ERR_ROUND, field="round")
        self.name = name
        self.sizing = RoundSizing(*check_sizing(sizing.comm_share, sizing.max_round,
                                                 sizing.overlap, sizing.sit_out))
        self.run = 1                # which run of the job (the state server counts inits)
        self.storage_id = None      # the caller's key for this job in its storage
        self._clock = clock
        self._lock = threading.Lock()
        self._workers = [_Worker(round=self.current_round) for _ in range(self.num_workers)]
        self.history: deque[ClosedRound] = deque(maxlen=HISTORY_IN_MEMORY)
        # Round reports (report_round): the last reported round, the plans answered, and when
        # the last report arrived (a round's duration on the server's clock).
        self.last_report_t = 0
        self._plans: dict[int, list[int]] = {}
        self._last_report_at: float | None = None     # unknown before the first report
        # Changes not yet taken by the persisting caller.
        self._dirty: set[int] = set()
        self._new_records: list[ClosedRound] = []
        self._new_reports: list[tuple[int, list[int]]] = []
        self._round_changed = False
        # Dynamic policy: the stretched round under way, its T fixed (``_round_length``).
        self._stretched: _StretchedRound | None = None

    # -- the policies ---------------------------------------------------------------------

    def apply(self, rank: int, k: int, c: float, t: int | None = None,
              d: float | None = None) -> bool:
        """Dynamic policy: is worker ``rank`` (``k`` iterations done, last one ``c`` s) ready?

        ``t`` (optional, the caller's round): a report of an older round changes nothing and
        answers ready; a newer round is entered first.
        """
        return self.decide(rank, k, c, t, d).ready

    def decide(self, rank: int, k: int, c: float, t: int | None = None,
               d: float | None = None) -> Decision:
        """``apply`` with the lease: how long this "not ready" answer stays true (``Decision``).

        ``d`` (optional): the worker's communication time of its last exchange, which sizes the
        rounds (``round_length``): a round longer than the slowest's iteration makes the slowest
        fill it too, counted from its entry into the round."""
        rank, k, c = self._check_report(rank, k, c)
        t = self._check_optional_round(t)
        d = self._check_optional_comm(d)
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
            if self._sits_out(me):
                # It computes nothing: ready at once, and nobody waits for it (``_slowest``).
                me.requests += 1
                self._record_comm(me, d)
                self._dirty.add(rank)
                return self._become_ready(me, rank)
            probing = k == 0 and me.c <= 0            # never timed: c is its warm-up probe's
            if probing:
                me.probe = c
            self._record_report(me, k, c, now)
            self._record_comm(me, d)
            self._dirty.add(rank)
            if k == 0 and self._judged_too_slow(rank, by_probes=probing):
                # Timed before computing (a worker's first question carries its warm-up step's
                # duration): it sits out this very round, without its first iteration.
                me.sit_out_from = me.round
                return self._become_ready(me, rank)
            if me.round < self.current_round:
                # Others have left this worker's round: with --overlap a worker goes on into
                # the next round as soon as it has pushed. This one is the last of its round
                # (everyone else waits for its push): ready after its iteration.
                return self._become_ready(me, rank) if k > 0 else NOT_READY
            first_round = k > 0 and any(worker.c <= 0 for worker in self._workers)
            if first_round and not any(worker.ready for worker in self._workers):
                # The first round: some device has not finished an iteration, so the slowest
                # is not known and may be that one. Nobody stops before every device is timed,
                # so the first aggregate holds what the fast devices computed meanwhile.
                since = now - (me.round_start if me.round_start is not None else now)
                return Decision(False, max(c, FIRST_ROUND_LEASE * since))
            s = self._slowest()
            slow = self._workers[s]
            in_round = slow.round == self.current_round
            length = self._round_length()
            longer = length > slow.c                      # the slowest runs several iterations
            if in_round and (rank == s and not longer or slow.ready):
                # k = 0: everyone computes at least once
                if k == 0:
                    return NOT_READY
                # A worker never timed (the first round) may still be computing: as far as
                # the server knows, as long as this one's iteration
                untimed = rank == s and not slow.ready and any(
                    worker.c <= 0 for worker in self._workers)
                return self._become_ready(me, rank, wait=c if untimed else 0.0)
            if rank == s and (not in_round or k == 0):
                return NOT_READY
            if rank == s and self._stretched is not None:
                # A stretched round is its whole iterations: counted, not timed (each also
                # costs it what lies outside its c: its batch, its question).
                if k >= self._stretched.iterations:
                    return self._become_ready(me, rank)
                return Decision(False, (self._stretched.iterations - k + 0.5) * c)
            lease = length - self._slack(rank, s)
            if not in_round or not slow.started:
                # The slowest has not started this round (or not reported in it): not ready.
                # It starts after now, so its round ends at least T from now.
                return Decision(False, max(0.0, lease))
            # Today's rule counts c_s from the slowest's last report (its only one: its entry);
            # a longer round counts T from the slowest's entry into the round.
            since = slow.seen if not longer or slow.round_start is None else slow.round_start
            remaining = length - (now - since)            # of the slowest's round
            budget = lease - (now - since)                # remaining - slack
            if k == 0:
                return Decision(False, max(0.0, budget))  # everyone computes at least once
            if c > budget:
                return self._become_ready(me, rank, wait=max(0.0, remaining))
            return Decision(False, budget)                # one more iteration fits

    def plan(self, rank: int, c: float, t: int | None = None, d: float | None = None) -> int:
        """Planned policy: local iterations for worker ``rank`` this round (last duration ``c``).

        ``t`` as in ``apply``: an older round answers the k planned then, unchanged.
        """
        rank = self._check_rank(rank)
        c = check_float(c, low=0.0, high=MAX_C, message=ERR_C, field="c")
        t = self._check_optional_round(t)
        d = self._check_optional_comm(d)
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
            self._record_comm(me, d)
            me.seen = now
            me.started = True
            if me.round_start is None:
                me.round_start = now
            me.planned_k = plan_for(rank, [w.c for w in self._workers], epsilon=self.epsilon,
                                    overheads=[w.overhead for w in self._workers],
                                    length=self._round_length())
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

    def report_round(self, t: int, ks, cs, ds=None, os_=None) -> RoundReport:
        """Every worker's ``k`` and ``c`` (and optionally ``d``, its communication time, and
        ``o``, the time its aggregation computed) of round ``t`` at once; the plan for the next
        round. With ``o``, a worker whose aggregation takes longer (a slow device) counts as
        the slack ``o_i - o_s``: the others get that time to compute (``slack_of``).

        Called by rank 0 after round t's exchange. Enters every worker into round t + 1, closes
        round t for each, and plans with ``plan_round``. A repeated report of a round already
        reported changes nothing and answers the plan given then (or the newest one).
        """
        return self.report_rounds([(t, ks, cs, ds, os_)])

    def report_rounds(self, reports) -> RoundReport:
        """Several ``(t, ks, cs[, ds])`` reports in order (a reporter catching up); the last
        answer.

        Every report is checked before any is applied, so a bad one changes nothing.
        """
        if not isinstance(reports, (list, tuple)) or not 1 <= len(reports) <= MAX_BATCH:
            raise PolicyError(ERR_BATCH, "rounds")
        checked = [self._check_round_report(*report) for report in reports]
        if self.policy != "planned":
            raise PolicyMismatch(ERR_WRONG_POLICY_ROUNDS, "policy")
        answer = None
        for t, ks, cs, ds, os_ in checked:
            answer = self._report_round(t, ks, cs, ds, os_)
        return answer

    def _check_round_report(self, t, ks, cs, ds=None, os_=None) -> tuple:
        t = check_int(t, low=1, high=MAX_ROUND - 1, message=ERR_ROUND, field="t")
        ks = self._check_vector(ks, ERR_ROUND_K, "k", integer=True)
        cs = self._check_vector(cs, ERR_ROUND_C, "c", integer=False)
        if ds is not None:
            ds = self._check_vector(ds, ERR_ROUND_D, "d", integer=False, high=MAX_COMM)
        if os_ is not None:
            os_ = self._check_vector(os_, ERR_ROUND_O, "o", integer=False, high=MAX_COMM)
        return t, ks, cs, ds, os_

    def _report_round(self, t: int, ks: list, cs: list, ds: list | None,
                      os_: list | None = None) -> RoundReport:
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
                record = ClosedRound(round=t, rank=rank, k=k, c=c, compute=round(compute, 6),
                                     wait=round(max(0.0, since - compute), 6)
                                     if since is not None else 0.0)
                records.append(record)
                me.round = max(me.round, t + 1)
                me.round_k, me.round_compute, me.ready = 0, 0.0, False
                me.round_start = now
                self._record_comm(me, ds[rank] if ds is not None else None)
                if os_ is not None:        # per round here: what its aggregation computes
                    me.overhead = _smoothed(me.overhead, os_[rank], OVERHEAD_SMOOTHING)
            self.current_round = max(self.current_round, t + 1)
            plan = plan_round([w.c for w in self._workers], epsilon=self.epsilon,
                              overheads=[w.overhead for w in self._workers],
                              length=self._round_length())
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
                    "slack": self._slack(rank, s) if w.c > 0 else None, "comm": w.comm,
                    **({"sits_out": True} if self._sits_out(w) else {}),
                })
            return {"job": self.name, "policy": self.policy, "epsilon": self.epsilon,
                    "sizing": self.sizing.as_dict(), "round_length": self._round_length(),
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

    def _check_vector(self, values, message: str, field: str, *, integer: bool,
                      high: float = MAX_C) -> list:
        message = message.format(num_workers=self.num_workers)
        if not isinstance(values, (list, tuple)) or len(values) != self.num_workers:
            raise PolicyError(message, field)
        if integer:
            return [check_int(v, low=0, high=MAX_K, message=message, field=field) for v in values]
        return [check_float(v, low=0.0, high=high, message=message, field=field)
                for v in values]

    @staticmethod
    def _persisted(worker: _Worker) -> dict:
        return {name: getattr(worker, name) for name in PERSISTED_FIELDS}

    def _enter(self, rank: int, t: int, now: float, *, durable: bool = True) -> ClosedRound | None:
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
        me.k, me.ready = 0, False          # told "ready" in a round the others had left
        me.round_k, me.round_compute, me.planned_k = 0, 0.0, None
        me.round_start = now
        me.started = False
        me.round = t
        self._dirty.add(rank)
        self._round_changed = self._round_changed or durable
        if record is not None:
            self._new_records.append(record)
        return record

    def _become_ready(self, me: _Worker, rank: int, *, wait: float = 0.0) -> Decision:
        """Tell ``me`` (worker ``rank``) to aggregate (``wait``: what is left of the slowest's
        round, which ``me`` will wait for). The first "ready" of a round must survive a restart
        (the worker will not ask again: it is in the exchange, where the others need it), so it
        asks the caller to persist before answering. That first "ready" also decides, from
        every device's latest c, whether ``me`` sits out from its next round on; every "ready"
        after it says so again."""
        if not me.ready:
            me.ready = True
            self._round_changed = True
            if self._judged_too_slow(rank):
                me.sit_out_from = me.round + 1
        if me.sit_out_from:
            return Decision(True, wait=wait, sit_out=True)
        return Decision(True, wait=wait) if wait else READY

    def _sits_out(self, worker: _Worker) -> bool:
        """Whether ``worker`` sits out the current round (``_Worker.sit_out_from``), counted by
        the job's round: the others' next round must not wait for it to enter that round (its
        exchange of the round before may still be under way)."""
        return bool(worker.sit_out_from) and self.current_round >= worker.sit_out_from

    def _judged_too_slow(self, rank: int, *, by_probes: bool = False) -> bool:
        """Worker ``rank`` (not sitting out yet) is too slow to wait for, by every device's
        latest c (``rules.sitting_out_ranks``: against the devices timed so far).

        ``by_probes``: its c is its warm-up probe's, judged against the others' probes, not
        their iterations. A probe times a step on a fraction of a batch and scales it to a
        whole one, which overstates a step whose cost is partly fixed (lenet at batch 8: 3.1x,
        docs/ALGORITHM.md): against a fast device's real iterations an 8x device could read as
        over 32x and sit out for good. Every device's probe is overstated alike.

        Otherwise every device reads as its ``_Worker.pace``, and ``rank`` is judged only once
        it has two timings (its probe and first iteration, or two iterations): on a loaded
        2-core host one x4 iteration read 77x the x1's, and on its latest c alone the x4 device
        sat out for the rest of the run."""
        me = self._workers[rank]
        if me.sit_out_from or self.sizing.sit_out <= 0 or self.policy != "dynamic":
            return False                          # already out, or the rule is off
        if not by_probes and me.earlier_c <= 0:
            return False                          # one timing: not judged yet
        timings = [w.probe if by_probes else w.pace for w in self._workers]
        return (rank in sitting_out_ranks(timings, self.sizing.sit_out)
                and self._others_take_part(rank))

    def _others_take_part(self, rank: int) -> bool:
        """Someone besides ``rank`` still computes (the fastest device never sits out, but two
        devices of one speed could both be judged against a fastest that later sits out)."""
        return any(not w.sit_out_from for r, w in enumerate(self._workers) if r != rank)

    def _record_report(self, me: _Worker, k: int, c: float, now: float) -> None:
        me.requests += 1
        if me.started and me.seen is not None and k == me.round_k + 1:
            sample = max(0.0, (now - me.seen) - c)
            me.overhead = _smoothed(me.overhead, sample, OVERHEAD_SMOOTHING)
        if k > me.round_k:
            me.round_compute += c if k == me.round_k + 1 else c * (k - me.round_k)
            me.round_k = k
            me.earlier_c = me.c                        # a new iteration's timing: shift
        if me.round_start is None:
            me.round_start = now
        me.k, me.c, me.seen, me.started = k, c, now, True

    def _round_length(self) -> float:
        """The round's duration T by ``round_length`` from the latest c and communication.

        Under the planned policy the round reports carry each aggregation's arithmetic
        (overheads, per round): the largest is time its device does not train, so it counts
        against the share with the transfer (and, with overlap, alone). The dynamic policy's
        overheads are per iteration (the server's own measure, for the slack) and do not count.
        Under the dynamic policy a stretched round keeps the T first computed in it.
        """
        if self._stretched is not None:
            if self._stretched.round == self.current_round:
                return self._stretched.length
            self._stretched = None
        on_time = [w.c for w in self._workers if not self._sits_out(w)]
        c_s = max(on_time)
        cost = transfer_estimate([w.comm for w in self._workers])
        overhead = 0.0
        if self.policy == "planned":
            overhead = max(w.overhead or 0.0 for w in self._workers)
        length = round_length(c_s, cost, self.sizing, overhead)
        if len(on_time) < self.num_workers and min(on_time) > 0:
            length = max(length, bounded_length(on_time))   # someone sits out
        if self.policy == "dynamic" and length > c_s > 0:
            # Every lease of the round and the slowest's own stop count against one T. Computed
            # afresh at each decision, T moved with every report's c and d (each worker sends
            # its d with its first question of a round), and on shaped links the x8 device
            # stopped with more than one of its iterations left in the others' round.
            self._stretched = _StretchedRound(self.current_round, length, round(length / c_s))
        return length

    @staticmethod
    def _record_comm(me: _Worker, d: float | None) -> None:
        if d is None or d <= 0:
            return
        me.comm = _smoothed(me.comm, d, COMM_SMOOTHING)

    @staticmethod
    def _check_optional_comm(d) -> float | None:
        if d is None:
            return None
        return check_float(d, low=0.0, high=MAX_COMM, message=ERR_D, field="d")

    def _slowest(self) -> int:
        """Rank with the largest c among the workers that take part (lowest rank on ties)."""
        return slowest_rank([0.0 if self._sits_out(worker) else worker.c
                             for worker in self._workers])

    def _slack(self, rank: int, s: int) -> float:
        return slack_of(self.epsilon, c_i=self._workers[rank].c, num_workers=self.num_workers,
                        overhead_i=self._workers[rank].overhead or 0.0,
                        overhead_s=self._workers[s].overhead or 0.0)

    def _close_round(self, rank: int, me: _Worker, now: float) -> ClosedRound | None:
        if me.round_start is None:
            return None                                   # never active in that round
        if me.planned_k is not None:
            k, compute = me.planned_k, me.planned_k * me.c
        else:
            k, compute = me.round_k, me.round_compute
        wait = max(0.0, (now - me.round_start) - compute)
        record = ClosedRound(round=me.round, rank=rank, k=k, c=me.c,
                             compute=round(compute, 6), wait=round(wait, 6))
        self.history.append(record)
        return record


def _smoothed(average: float | None, sample: float, weight: float) -> float:
    """Exponential moving average with ``weight`` for the newest sample (the first is kept)."""
    return sample if average is None else (1 - weight) * average + weight * sample


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
