"""ESync's round sizing: who decides how many local iterations ``k_i`` a worker runs in a round.

- ``FixedRounds`` (``--local-iters K``): the state server is bypassed and every worker runs
  exactly K local steps (K = 1 with ``-gl 1`` and no outer momentum is one SSGD step: a test
  checks that identity).
- ``DynamicRounds`` (``--policy dynamic``, the original's decision): ``/apply/`` ("one more?") as
  ``esync.coordination.client.ReadinessAsker`` asks it: a "not ready" answer carries a lease
  (``budget``: how long, by the server's own rule, "not ready" stays true), a fast worker skips
  the round's first question, and a worker's first call of a round enters it (no ``/reset/``).
  A fast worker asks twice per round, not before each of its iterations; the slowest computes
  while its first question (always "not ready") travels.
- ``PlannedRounds`` (``--policy planned``): no worker waits for HTTP. The exchange's control
  vector carries every worker's ``k_i`` and last iteration time ``c_i``; rank 0 reports them to
  the state server from a background thread (``PlanReporter``, ``POST /jobs/<job>/rounds/``) and
  writes the newest plan it got back into the plan slots of its next push, so every worker reads
  its next ``k_i`` from the exchange it does anyway (``k_i = 1`` until a plan exists).

Under both policies rounds are sized by compute and transfer: every exchange's control vector
also carries how long each worker's previous exchange took (``d``); the state server stretches a
round so that the transfer stays within ``--comm-share`` of it
(``esync.coordination.rules.round_length``).

What the composed algorithm calls (``RoundSizer``): ``continue_local`` before each local
iteration, ``plan_to_send`` for a push's plan slots, ``after_exchange`` with the summed control
vector, ``extras`` for the round log, ``announce``/``speed_changed`` for the dashboard,
``requests`` and ``close``; ``--carry`` reads ``told_wait`` and calls ``begin_next_round``.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from esync.common.esync_parts import sit_out_ratio
from esync.common.speeds import communication_threads
from esync.coordination.client import ReadinessAsker, SpeedAnnouncer, StateClient
from esync.coordination.rules import RoundSizing, planned_continue, planned_round_budget
from esync.worker.algorithms.esync.reporter import PlanReporter


class RoundSizer:
    """The interface, with what a sizing without a state server does: nothing."""

    name = ""
    told_wait = 0.0          # the dynamic policy's last "ready": how long the slowest still computes
    sitting_out = False      # ... and whether this worker sits out from its next round on

    def __init__(self, config, worker):
        self.config, self.worker = config, worker

    def continue_local(self, k: int, carried: int, last_c: float, record) -> bool:
        """True while the worker should run another local iteration this round (``k`` done,
        ``carried`` more were carried into the round, the last took ``last_c`` s)."""
        raise NotImplementedError

    def plan_to_send(self):
        """Rank 0's plan for the control vector of the push about to start; None: no plan."""
        return None

    def after_exchange(self, control, t: int, last_comm: float) -> None:
        """Round ``t``'s summed control vector has arrived; its exchange took ``last_comm`` s."""

    def extras(self) -> dict:
        return {}

    def announce(self, *, host: str, device: str, slowdown: float | None = None) -> None:
        pass

    def speed_changed(self, slowdown: float) -> None:
        pass

    def begin_next_round(self, t: int, last_c: float) -> None:
        pass

    def requests(self) -> int:
        return 0

    def close(self) -> None:
        pass


class FixedRounds(RoundSizer):
    name = "fixed"

    def continue_local(self, k: int, carried: int, last_c: float, record) -> bool:
        return k < self.config.local_iters


class ServerRounds(RoundSizer):
    """A state server decides: its client, and the hellos that tell the dashboard where this
    worker runs and how slow it is. ``client``: a ready one (tests), else one is made."""

    def __init__(self, config, worker, *, client=None):
        super().__init__(config, worker)
        self.client = client if client is not None else self._new_client()
        self.where = None                    # (host, device) as announced: for later hellos
        self.speed_announcer = None          # made at the first speed change

    def _new_client(self) -> StateClient:
        cfg = self.config
        return StateClient(cfg.state_url, job=cfg.job, token=cfg.state_token)

    def _create_job(self) -> None:
        """Rank 0, before the KVStore barrier in init: no worker reports before the job exists."""
        cfg = self.config
        self.client.init(self.worker.num_workers, epsilon=cfg.epsilon, policy=cfg.policy,
                         sizing=RoundSizing(cfg.comm_share, cfg.max_round_seconds, cfg.overlap,
                                            sit_out=sit_out_ratio(cfg)))

    def announce(self, *, host: str, device: str, slowdown: float | None = None) -> None:
        """Before the training clock starts, in the training thread (as before the factor was
        added): a refused hello here is a misconfigured job and ends the worker like any call."""
        self.where = (host, device)
        self.client.hello(self.worker.rank, host=host, device=device, slowdown=slowdown)

    def speed_changed(self, slowdown: float) -> None:
        """Mid-training: the hello goes from a background thread and its failures are only
        reported (``SpeedAnnouncer``), so the round neither waits for nor dies of the dashboard."""
        if self.where is None:
            return
        if self.speed_announcer is None:
            host, device = self.where
            self.speed_announcer = SpeedAnnouncer(self._new_client(), self.worker.rank,
                                                  host=host, device=device)
        self.speed_announcer.changed(slowdown)

    def requests(self) -> int:
        return self.client.requests_made

    def close(self) -> None:
        if self.speed_announcer is not None:
            self.speed_announcer.close()
        self.client.close()


class DynamicRounds(ServerRounds):
    name = "dynamic"

    def __init__(self, config, worker, *, client=None):
        super().__init__(config, worker, client=client)
        # The questions go through one thread of their own, in order: the slowest sends its
        # first question of a round without waiting for the answer. It is the host's network
        # work, outside the device's CPU cap.
        with communication_threads():
            self.questions = ThreadPoolExecutor(1, thread_name_prefix="esync-questions")
            self.questions.submit(int).result()       # the thread starts now
        self.asker = ReadinessAsker(self.client, worker.rank, call=self._ask,
                                    submit=self.questions.submit,
                                    may_sit_out=sit_out_ratio(config) > 0)
        if worker.rank == 0:
            self._create_job()

    def _ask(self, fn, *args):
        return self.questions.submit(fn, *args).result()

    @property
    def told_wait(self) -> float:
        return self.asker.wait

    @property
    def sitting_out(self) -> bool:
        return self.asker.sitting_out

    def continue_local(self, k: int, carried: int, last_c: float, record) -> bool:
        # Iterations carried into the round count: a worker may be ready without its own
        # (with --carry-slowest the slowest's round then ends as soon as it asks)
        return self.asker.continue_local(k + carried, last_c, self.worker.round_no,
                                         timing=lambda: record.phase("check ready"))

    def begin_next_round(self, t: int, last_c: float) -> None:
        self.asker.begin_next_round(t, last_c)

    def after_exchange(self, control, t: int, last_comm: float) -> None:
        """The exchange's duration goes with the next ``/apply/``: the next round's first call
        (k = 0, t = the next round) enters it, so no ``/reset/`` is needed."""
        self.asker.comm = last_comm

    def extras(self) -> dict:
        # the state server's "ready": what the slowest still computed (--carry's cue)
        return {"slowest_rest": round(self.asker.wait, 6)}

    def close(self) -> None:
        super().close()
        self.questions.shutdown(wait=False)


class PlannedRounds(ServerRounds):
    name = "planned"

    def __init__(self, config, worker, *, client=None):
        super().__init__(config, worker, client=client)
        self.next_k = 1                      # k_i of the coming round
        self.round_budget = 0.0              # ... and the others' planned computing in it
        self.round_computed = 0.0            # ... and this worker's computing so far
        self.round_planned = None            # ... the k this round was planned for (logged)
        self.plan_sent = None                # round whose plan rank 0 wrote into the last push
        self.reported = None                 # rank 0: the control sum it reported last round
        self.reporter = None
        if worker.rank == 0:
            self._create_job()
            with communication_threads():             # its thread: outside the CPU cap
                self.reporter = PlanReporter(self._new_client())

    def continue_local(self, k: int, carried: int, last_c: float, record) -> bool:
        if k == 0:
            self.round_planned, self.round_computed = self.next_k, 0.0
        else:
            self.round_computed += last_c
        return planned_continue(k, self.next_k, self.round_computed, last_c, self.round_budget)

    def plan_to_send(self):
        self.plan_sent = None
        if self.reporter is None:
            return None
        newest = self.reporter.newest()
        if newest is None:
            return None
        self.plan_sent, plan = newest
        return plan

    def after_exchange(self, control, t: int, last_comm: float) -> None:
        """Take the next k from the plan slots, hand the round to the reporter (rank 0)."""
        self.reported = None
        if any(control.plan):
            self.next_k = max(1, control.plan[self.worker.rank])
            self.round_budget = planned_round_budget(self.worker.rank, control.plan, control.c)
        if self.reporter is not None:
            self.reporter.submit(t, control.k, control.c, control.d, control.o)
            self.reported = control

    def extras(self) -> dict:
        """A k below ``planned_k``: the device slowed down within the round
        (``planned_continue``); rank 0: what it reported and which round's plan it sent."""
        extras = {} if self.round_planned is None else {"planned_k": self.round_planned}
        if self.reporter is None or self.reported is None:
            return extras
        return dict(extras, reported_k=self.reported.k, reported_c=self.reported.c,
                    reported_d=self.reported.d, reported_o=self.reported.o,
                    plan_sent_from_round=self.plan_sent)

    def requests(self) -> int:
        return super().requests() + (self.reporter.client.requests_made if self.reporter else 0)

    def close(self) -> None:
        if self.speed_announcer is not None:
            self.speed_announcer.close()
        if self.reporter is not None:
            self.reporter.close()
        self.client.close()
