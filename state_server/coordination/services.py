"""Writes: create jobs, record decisions, rounds and closed rounds. Views call these; they call
esync.coordination.job.

The live state of every job is an ``esync.coordination.job.JobState`` held in this process (one gunicorn
process, many threads). The database keeps what a restart needs: the job (``Job``), every
worker's round and state (``WorkerState``), the round reports and their plans (``RoundReport``),
and the round history (``WorkerRound``).

Persist before acknowledging: a call that changes a round (``reset``, ``rounds``, a ``plan``
that enters a newer round) answers only after the change is committed. Commits go through one
writer thread that writes whatever is pending, from every job and request, in one transaction
(group commit): 256 workers resetting at once cost a few transactions, not 256. ``apply`` (the
hot path of the dynamic policy) waits for no commit, except for a worker's first "ready" of a
round; the round it enters, carried by every call, is written with the next commit (a restart
that lost it is moved forward again by the worker's next call).

The first call for a job that is in the database but not in memory (after a restart) rebuilds it
from its rows: configuration, every worker's round and state, the last round report.
"""
from __future__ import annotations

import json
import logging
import threading

from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from esync.coordination.limits import AUTO
from esync.coordination.job import Changes, JobRegistry, JobState
from esync.coordination.rules import COMPUTE_ONLY, Decision, RoundSizing

from .models import Job, RoundReport, WorkerRound, WorkerState

ERR_UNKNOWN_JOB = "unknown job {job!r}: call init first"
ERR_PERSIST = "the state server could not write its database: {detail}"
PERSIST_TIMEOUT = 60.0          # seconds a request waits for its commit before answering 503

log = logging.getLogger(__name__)
registry = JobRegistry()


class JobNotFound(Exception):
    def __init__(self, job: str):
        super().__init__(ERR_UNKNOWN_JOB.format(job=job))
        self.message = str(self)
        self.field = "job"


class PersistError(Exception):
    """The database write behind an acknowledgement failed: the call is answered 503 (retry)."""

    def __init__(self, detail: str):
        super().__init__(ERR_PERSIST.format(detail=detail))
        self.message = str(self)
        self.field = None


def _epsilon_to_db(epsilon: float | str) -> str:
    return AUTO if epsilon == AUTO else repr(float(epsilon))


def _epsilon_from_db(text: str) -> float | str:
    return AUTO if text == AUTO else float(text)


# -- the group-commit writer --------------------------------------------------------------------

class _Ticket:
    __slots__ = ("job", "done", "error")

    def __init__(self, job: JobState):
        self.job, self.done, self.error = job, threading.Event(), None


class Persister:
    """One writer thread; ``persist(job)`` returns once the job's pending changes are committed."""

    def __init__(self):
        self._pending: list[_Ticket] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def persist(self, job: JobState) -> None:
        ticket = _Ticket(job)
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="esync-state-writer",
                                                daemon=True)
                self._thread.start()
            self._pending.append(ticket)
            self._cond.notify()
        if not ticket.done.wait(PERSIST_TIMEOUT):
            raise PersistError(f"no commit within {PERSIST_TIMEOUT:.0f} s")
        if ticket.error is not None:
            raise PersistError(ticket.error)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                batch, self._pending = self._pending, []
            jobs = list({id(t.job): t.job for t in batch}.values())
            taken = [(job, job.take_changes()) for job in jobs]
            error = None
            try:
                close_old_connections()
                with transaction.atomic():
                    for job, changes in taken:
                        if changes:
                            _write(job, changes)
            except Exception as exc:               # reported to every waiting request (503)
                error = f"{type(exc).__name__}: {exc}"
                log.error("state server: database write failed: %s", error)
                for job, changes in taken:
                    job.give_back(changes)
                try:
                    connection.close()
                except Exception:
                    pass
            for ticket in batch:
                ticket.error = error
                ticket.done.set()


def _write(job: JobState, changes: Changes) -> None:
    """One job's changes, inside the writer's transaction.

    Plain SQL (``executemany`` for rows): a round report of 256 workers writes 513 rows, which the
    ORM's per-instance machinery would spend a hundred times longer preparing than SQLite
    spends writing.
    """
    job_id, run = job.storage_id, job.run
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(_ADVANCE_JOB_ROUND, (changes.current_round, job_id, run,
                                            changes.current_round))
        if changes.workers:
            cursor.executemany(_UPSERT_WORKER_STATE, [
                (job_id, run, rank, w["round"], w["k"], w["c"], w["ready"], w["planned_k"],
                 w["overhead"], w["round_k"], w["round_compute"], w["sit_out_from"])
                for rank, w in changes.workers.items()])
        if changes.records:
            cursor.executemany(_UPSERT_WORKER_ROUND, [
                (job_id, run, r.round, r.rank, r.k, r.c, r.compute, r.wait, now)
                for r in changes.records])
        if changes.reports:
            cursor.executemany(_INSERT_ROUND_REPORT, [
                (job_id, run, t, json.dumps(plan), now) for t, plan in changes.reports])


_ADVANCE_JOB_ROUND = (
    f"UPDATE {Job._meta.db_table} SET current_round = %s WHERE id = %s AND run = %s "
    "AND current_round < %s")
_UPSERT_WORKER_STATE = (
    f"INSERT INTO {WorkerState._meta.db_table} (job_id, run, rank, round, k, c, ready, "
    "planned_k, overhead, round_k, round_compute, sit_out_from) VALUES (%s, %s, %s, %s, %s, %s, "
    "%s, %s, %s, %s, %s, %s) ON CONFLICT (job_id, rank) DO UPDATE SET run = excluded.run, "
    "round = excluded.round, k = excluded.k, c = excluded.c, ready = excluded.ready, "
    "planned_k = excluded.planned_k, overhead = excluded.overhead, round_k = excluded.round_k, "
    "round_compute = excluded.round_compute, sit_out_from = excluded.sit_out_from")
_UPSERT_WORKER_ROUND = (
    f"INSERT INTO {WorkerRound._meta.db_table} (job_id, run, round, rank, k, c, compute, wait, "
    "recorded_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (job_id, run, round, "
    "rank) DO UPDATE SET k = excluded.k, c = excluded.c, compute = excluded.compute, "
    "wait = excluded.wait")
_INSERT_ROUND_REPORT = (
    f"INSERT INTO {RoundReport._meta.db_table} (job_id, run, round, plan, recorded_at) "
    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (job_id, run, round) DO NOTHING")


persister = Persister()


# -- jobs -------------------------------------------------------------------------------------

def job_init(*, name: str, num_workers: int, epsilon: float | str, policy: str,
             key: str = "", sizing: RoundSizing = COMPUTE_ONLY) -> dict:
    """Create job ``name`` or start a new run of it: round 1, no worker state, empty history.

    ``key`` (optional, chosen by the client per init) makes a retried init harmless: the same
    key and configuration as the current run answer that run instead of starting another.
    """
    live = JobState(name=name, num_workers=num_workers, epsilon=epsilon, policy=policy,
                    sizing=sizing)
    epsilon_db = _epsilon_to_db(live.epsilon)
    sizing_db = live.sizing.as_dict()
    with transaction.atomic():
        job, created = Job.objects.get_or_create(name=name, defaults={
            "num_workers": live.num_workers, "epsilon": epsilon_db, "policy": live.policy,
            "sizing": sizing_db, "current_round": 1, "run": 1, "init_key": key})
        repeated = (not created and key and job.init_key == key
                    and (job.num_workers, job.epsilon, job.policy, job.sizing)
                    == (live.num_workers, epsilon_db, live.policy, sizing_db))
        if not created and not repeated:
            job.num_workers, job.policy, job.epsilon = live.num_workers, live.policy, epsilon_db
            job.sizing = sizing_db
            job.current_round, job.run, job.init_key = 1, job.run + 1, key
            job.save()
            WorkerState.objects.filter(job=job).delete()
    if repeated:
        current = job_live(name=name)
        return {"job": name, "run": job.run, "num_workers": current.num_workers,
                "epsilon": current.epsilon, "policy": current.policy,
                "sizing": current.sizing.as_dict(), "round": current.current_round}
    live.storage_id, live.run = job.pk, job.run
    registry.put(live)
    return {"job": name, "run": job.run, "num_workers": live.num_workers,
            "epsilon": live.epsilon, "policy": live.policy, "sizing": sizing_db,
            "round": live.current_round}


def job_live(*, name: str) -> JobState:
    """The in-memory state of job ``name``, rebuilt from the database after a restart."""
    live = registry.get(name)
    if live is not None:
        return live
    row = Job.objects.filter(name=name).first()
    if row is None:
        raise JobNotFound(name)
    rebuilt = JobState(name=name, num_workers=row.num_workers,
                       epsilon=_epsilon_from_db(row.epsilon), policy=row.policy,
                       current_round=row.current_round,
                       sizing=RoundSizing(**row.sizing) if row.sizing else COMPUTE_ONLY)
    rebuilt.storage_id, rebuilt.run = row.pk, row.run
    workers = {state.rank: {"round": state.round, "k": state.k, "c": state.c,
                            "ready": state.ready, "planned_k": state.planned_k,
                            "overhead": state.overhead, "round_k": state.round_k,
                            "round_compute": state.round_compute,
                            "sit_out_from": state.sit_out_from}
               for state in WorkerState.objects.filter(job=row, run=row.run)}
    last = RoundReport.objects.filter(job=row, run=row.run).order_by("-round").first()
    rebuilt.restore(workers, last_report_t=last.round if last else 0,
                    last_plan=last.plan if last else None)
    return registry.setdefault(rebuilt)


# -- worker calls -------------------------------------------------------------------------------

def worker_apply(*, job: str, rank: int, k: int, c: float, t: int | None = None,
                 d: float | None = None) -> Decision:
    """Dynamic policy: is the worker ready to aggregate (and for how long is "no" true)?

    No database write for an iteration; only a worker's first "ready" of a round (or a newer
    ``t``) is committed before the answer, since a restarted server must know who already
    left the local phase: that worker will not ask again, and the others wait for it.
    """
    live = job_live(name=job)
    decision = live.decide(rank, k, c, t, d)
    if live.needs_persisting():
        persister.persist(live)
    return decision


def worker_plan(*, job: str, rank: int, c: float, t: int | None = None,
                d: float | None = None) -> int:
    """Planned policy (one call per worker): local iterations for this worker this round."""
    live = job_live(name=job)
    k = live.plan(rank, c, t, d)
    if live.needs_persisting():
        persister.persist(live)
    return k


def worker_enter_round(*, job: str, rank: int, round: int) -> dict:
    """The worker entered ``round``: committed (its state, its closed round) before the answer.

    A repeated call commits too (whatever is pending): its answer must not overtake the commit
    of the call it repeats.
    """
    live = job_live(name=job)
    entry = live.enter_round(rank, round)
    persister.persist(live)
    return {"round": entry.current_round}


def job_report_rounds(*, job: str, reports: list) -> dict:
    """Rank 0's report(s) of rounds (every worker's k and c): committed, then the last plan."""
    live = job_live(name=job)
    report = live.report_rounds(reports)
    persister.persist(live)
    return {"t": report.t, "plan": report.plan}
