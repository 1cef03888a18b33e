"""ESync (Li et al., "ESync: An Efficient Synchronous Parallel Algorithm for Distributed ML in
Heterogeneous Clusters"): every device computes for the whole round.

Each round a worker runs ``k_i`` local SGD steps (``-ll``), then all workers aggregate their model
deltas through the parameter server with the rule of ``--aggregation`` and the optional outer
momentum (``esync.worker.algorithms.aggregate`` holds the maths); batch-norm statistics are averaged.
``k_i`` comes from the state server:

- ``--policy dynamic`` (the original's decision): ``/apply/`` ("one more?") as
  ``esync.coordination.client.ReadinessAsker`` asks it: a "not ready" answer carries a lease
  (``budget``: how long, by the server's own rule, "not ready" stays true), a fast worker skips
  the round's first question, and a worker's first call of a round enters it (no ``/reset/``).
  A fast worker asks twice per round, not before each of its iterations.
- ``--policy planned``: no worker waits for HTTP. The exchange's control vector carries every
  worker's ``k_i`` and last iteration time ``c_i``; rank 0 reports them to the state server from a
  background thread (``POST /jobs/<job>/rounds/``) and writes the newest plan it got back into the
  plan slots of its next push, so every worker reads its next ``k_i`` from the exchange it does
  anyway (``k_i = 1`` until a plan exists).

With ``--local-iters K`` the state server is bypassed and every worker runs exactly K local steps
(K = 1 with ``-gl 1`` and no outer momentum is one SSGD step: a test checks that identity).
"""
from __future__ import annotations

import queue
import threading

from mxnet import nd

import esync.worker.algorithms.aggregate as aggregate
from esync.worker.algorithms.base import Algorithm, datas
from esync.coordination.client import ReadinessAsker, SpeedAnnouncer, StateClient

MOMENTUM_STATE = "outer_momentum.{}"     # checkpoint names of the outer optimizer's buffers
MAX_REPORTS_PER_CALL = 64                # the state server's limit for one batch of round reports


class ESync(Algorithm):
    kvstore_type = "dist_sync"
    collective_stop = True

    def prepare(self) -> None:
        cfg, w = self.config, self.worker
        self.outer = aggregate.OuterOptimizer(momentum=cfg.outer_momentum,
                                              nesterov=cfg.nesterov)
        self.momentum = ([nd.zeros(p.shape, ctx=w.ctx) for p in w.trainable]
                         if self.outer.has_state else [None] * len(w.trainable))
        self.client = self.reporter = None
        self.where = None                    # (host, device) as announced: for later hellos
        self.speed_announcer = None          # made at the first speed change
        self.next_k = 1                      # planned policy: k_i of the coming round
        self.plan_sent = None                # round whose plan rank 0 wrote into the last push
        self.reported = None                 # rank 0: the control sum it reported last round
        if cfg.local_iters:
            return
        self.client = StateClient(cfg.state_url, job=cfg.job, token=cfg.state_token)
        self.asker = ReadinessAsker(self.client, w.rank)
        if w.rank == 0:
            # Before the KVStore barrier in init: no worker reports before the job exists.
            self.client.init(w.num_workers, epsilon=cfg.epsilon, policy=cfg.policy)
            if cfg.policy == "planned":
                self.reporter = PlanReporter(
                    StateClient(cfg.state_url, job=cfg.job, token=cfg.state_token))

    def state_arrays(self) -> dict:
        """The outer optimizer's buffers: checkpointed, and rank 0's reach every worker on start."""
        if not self.outer.has_state:
            return {}
        return {MOMENTUM_STATE.format(i): b for i, b in enumerate(self.momentum)}

    def setup(self) -> None:
        w = self.worker
        self.trainer = self.sgd(self.config.local_lr)
        self.weights = datas(w.trainable)
        self.start = [x.copy() for x in self.weights]
        self.delta_sum = [nd.zeros_like(x) for x in self.weights]
        self.aux = datas(w.aux)
        self.aux_sum = [nd.zeros_like(x) for x in self.aux]

    def announce(self, *, host: str, device: str, slowdown: float | None = None) -> None:
        """Before the training clock starts, in the training thread (as before the factor was
        added): a refused hello here is a misconfigured job and ends the worker like any call."""
        if self.client is not None:
            self.where = (host, device)
            self.client.hello(self.worker.rank, host=host, device=device, slowdown=slowdown)

    def speed_changed(self, slowdown: float) -> None:
        """Mid-training: the hello goes from a background thread and its failures are only
        reported (``SpeedAnnouncer``), so the round neither waits for nor dies of the dashboard."""
        if self.client is None or self.where is None:
            return
        if self.speed_announcer is None:
            cfg = self.config
            host, device = self.where
            self.speed_announcer = SpeedAnnouncer(
                StateClient(cfg.state_url, job=cfg.job, token=cfg.state_token),
                self.worker.rank, host=host, device=device)
        self.speed_announcer.changed(slowdown)

    def continue_local(self, k: int, last_c: float, record) -> bool:
        cfg, w = self.config, self.worker
        if cfg.local_iters:
            return k < cfg.local_iters
        if cfg.policy == "planned":
            return k < self.next_k
        return self.asker.continue_local(k, last_c, w.round_no,
                                         timing=lambda: record.phase("check ready"))

    def local_step(self, record) -> None:
        with record.phase("local update"):
            self.trainer.step(1)

    def aggregate(self, record, want_stop: bool) -> bool:
        w, cfg = self.worker, self.config
        with record.phase("global update"):
            push = aggregate.push_weight(cfg.aggregation, w.round_k)
            deltas = [x - s for x, s in zip(self.weights, self.start)]
            self.dump("esync", w.round_no, delta=deltas, k=w.round_k)
            pushed = [d * push for d in deltas]
            plan = self._plan_to_send()
            control = self.exchange(pushed + self.aux, self.delta_sum + self.aux_sum,
                                    w.keys.trainable + w.keys.aux, want_stop,
                                    k=w.round_k, c=w.round_c, plan=plan)
            self.worker_ks = control.k          # every worker's k_i, for rank 0's TensorBoard
            self._move_to_aggregate(aggregate.sum_weight(cfg.aggregation, control.k))
            for p, total in zip(w.aux, self.aux_sum):
                p.set_data(total / w.num_workers)
        self._coordinate(record, control)
        return control.stop

    def _move_to_aggregate(self, scale: float) -> None:
        """start <- start + gl * outer_step(scale * pulled sum); every worker computes the same."""
        for i, (p, start, total) in enumerate(zip(self.worker.trainable, self.start,
                                                  self.delta_sum)):
            step, buffer = self.outer.step(total * scale, self.momentum[i])
            if buffer is not None:
                self.momentum[i][:] = buffer
            start[:] = aggregate.apply_step(start, step, self.config.global_lr)
            p.set_data(start)

    def _plan_to_send(self):
        self.plan_sent = None
        if self.reporter is None:
            return None
        newest = self.reporter.newest()
        if newest is None:
            return None
        self.plan_sent, plan = newest
        return plan

    def _coordinate(self, record, control) -> None:
        """After the exchange (planned policy): take the next k, hand the round to the reporter.

        The dynamic policy has nothing to do here: the next round's first ``/apply/`` (k = 0,
        t = the next round) enters it, so no ``/reset/`` is needed.
        """
        cfg, w = self.config, self.worker
        self.reported = None
        if self.client is None or cfg.policy != "planned":
            return
        if any(control.plan):
            self.next_k = max(1, control.plan[w.rank])
        if self.reporter is not None:
            self.reporter.submit(w.round_no, control.k, control.c)
            self.reported = control

    def round_extras(self) -> dict:
        """Rank 0 under the planned policy: what it reported and which round's plan it sent."""
        if self.reporter is None or self.reported is None:
            return {}
        return {"reported_k": self.reported.k, "reported_c": self.reported.c,
                "plan_sent_from_round": self.plan_sent}

    def state_requests(self) -> int:
        clients = [self.client, self.reporter.client if self.reporter else None]
        return sum(c.requests_made for c in clients if c is not None)

    def close(self) -> None:
        if self.speed_announcer is not None:
            self.speed_announcer.close()
        if self.reporter is not None:
            self.reporter.close()
        if self.client is not None:
            self.client.close()


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

    def submit(self, t: int, ks, cs) -> None:
        self._raise_if_failed()
        self._queue.put((t, list(ks), list(cs)))

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
            for t, ks, cs in reports:
                plan = self.client.report_round(t, ks, cs)
        return t, [int(k) for k in plan]

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
