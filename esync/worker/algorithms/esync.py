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
  A fast worker asks twice per round, not before each of its iterations; the slowest computes
  while its first question (always "not ready") travels.
- ``--policy planned``: no worker waits for HTTP. The exchange's control vector carries every
  worker's ``k_i`` and last iteration time ``c_i``; rank 0 reports them to the state server from a
  background thread (``POST /jobs/<job>/rounds/``) and writes the newest plan it got back into the
  plan slots of its next push, so every worker reads its next ``k_i`` from the exchange it does
  anyway (``k_i = 1`` until a plan exists).

With ``--local-iters K`` the state server is bypassed and every worker runs exactly K local steps
(K = 1 with ``-gl 1`` and no outer momentum is one SSGD step: a test checks that identity).

Rounds sized by compute and transfer: every exchange's control vector also carries how long each
worker's previous exchange took (``d``); the state server stretches a round so that the transfer
stays within ``--comm-share`` of it (``esync.coordination.rules.round_length``).

``--prox-mu MU``: FedProx's proximal term (Li et al., "Federated Optimization in Heterogeneous
Networks", MLSys 2020): each local step also descends ``(mu/2) |w - w_start|^2`` per sample, so
a device running many steps on its own classes drifts less from the round's start; no traffic.

``--scaffold``: SCAFFOLD's control variates (Karimireddy et al., ICML 2020, option II). Each
local step descends ``g + c - c_i`` (``c`` the global variate, the same on every rank; ``c_i``
this worker's); after a round ``c_i <- c_i - c + (x - y_i) / (k_i * lr)`` (``x`` the round's
start, ``y_i`` the local model: the round's mean raw gradient). ``c`` is the mean of the
``c_i`` weighted as the rule weights their corrections (``aggregate.variate_weight``: with
unequal ``k_i`` the published plain mean leaves the fast workers' corrections in the global
step), and the weighted ``c_i`` travel with the deltas through keys of their own: twice the
traffic of a round.

``--accumulate``: the local iterations sum their gradients at the round's model, which stays put;
the delta is ``-ll`` times that sum. A round is then one SGD step on all the batches every device
computed in it, sized by speed as load-balanced BSP does (Chen et al., "Semi-dynamic load
balancing", SoCC 2020): no local model drifts towards the classes of its shard, at one model
update per round.

``--carry``: a device that ran two or more iterations in a round (so at least twice as fast as
the slowest), or that the state server's "ready" told the slowest still computes
(``Decision.wait``), keeps iterating while the round's exchange is in flight, from where its
local model stands, and carries those iterations into its next delta (counted in its next
``k_i``, and in its first question of the next round): when the exchange ends, its local model
becomes ``g`` plus what they moved it. The global model is not delayed (unlike ``--overlap``); a
device's wait for the slowest's push and for the transfer becomes computing. With
``--carry-slowest`` (dynamic policy) the slowest device carries too, and is ready as soon as it
asks after the exchange.

``--comm-dtype float16``: the deltas travel as half floats on keys of their own (half the bytes;
the global model and the outer step stay float32).

``--low-rank R``: each large delta travels as two rank-R factors (PowerSGD with error feedback,
``esync.worker.algorithms.lowrank``): the first exchange carries the small arrays in full and
each ``M_i Q``, a second one each ``M_i^T P^``; a few percent of the bytes, for slow links.

``--overlap``: the exchange of round r runs while round r+1 computes. The global model ``g``
(identical on every rank) moves one round late, when round r's sum arrives at the end of round
r+1; meanwhile each worker continues from ``g`` plus its own fresh delta (the "eager" variant of
Streaming DiLoCo), so one worker alone is exactly local SGD (docs/ALGORITHM.md has the maths).
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from mxnet import nd

import esync.worker.algorithms.aggregate as aggregate
from esync.worker.algorithms.lowrank import LowRankWire
from esync.common.speeds import communication_threads
from esync.worker.algorithms.base import Algorithm, ArraysInFlight, datas
from esync.coordination.client import ReadinessAsker, SpeedAnnouncer, StateClient
from esync.coordination.rules import (RoundSizing, planned_continue, planned_round_budget,
                                      slowest_rank)

MOMENTUM_STATE = "outer_momentum.{}"     # checkpoint names of the outer optimizer's buffers
VARIANCE_STATE = "outer_variance.{}"     # ... and of Adam's second moments (--outer-adam)
SCAFFOLD_STATE = "scaffold_c.{}"         # checkpoint names of SCAFFOLD's global control variate
MAX_REPORTS_PER_CALL = 64                # the state server's limit for one batch of round reports


def carries(round_k: int, *, slowest: bool, policy: str, told_wait: float,
            carry_slowest: bool) -> bool:
    """Whether a worker with --carry computes through this round's exchange (``_may_carry``).

    A device that ran two or more iterations in the round (at least twice as fast as the
    slowest) or, under the dynamic policy, one the state server told it would wait
    (``told_wait``, ``Decision.wait``). Not the slowest of several workers (``slowest``, by the
    last exchange's durations) unless ``carry_slowest``: the others wait for its push, and in a
    round stretched to several of its iterations (``--comm-share``) its carried iteration
    opened its next round early (measured: it then pushed after that one iteration and waited
    0.3-0.5 s for the others' round)."""
    if slowest and not carry_slowest:
        return False
    if round_k > 1:
        return True
    return policy == "dynamic" and (carry_slowest or told_wait > 0)


class ESync(Algorithm):
    kvstore_type = "dist_sync"
    collective_stop = True

    def prepare(self) -> None:
        cfg, w = self.config, self.worker
        self.outer = aggregate.OuterOptimizer(momentum=cfg.outer_momentum,
                                              nesterov=cfg.nesterov, adam=cfg.outer_adam,
                                              beta2=cfg.outer_beta2, epsilon=cfg.outer_epsilon)
        # The outer momentum: buffers until ``setup``, then the fused kernels' gl x buffer;
        # under Adam its first moment, and ``variance`` its second (kept as they are)
        self.momentum = ([nd.zeros(p.shape, ctx=w.ctx) for p in w.trainable]
                         if self.outer.has_state else [None] * len(w.trainable))
        self.variance = ([nd.zeros(p.shape, ctx=w.ctx) for p in w.trainable]
                         if self.outer.adam else [None] * len(w.trainable))
        self.variate = self.own_variate = None
        self.lowrank = (LowRankWire([p.shape for p in w.trainable], cfg.low_rank, w.ctx)
                        if cfg.low_rank else None)
        if cfg.scaffold:
            self.variate = [nd.zeros(p.shape, ctx=w.ctx) for p in w.trainable]       # c
            self.own_variate = [nd.zeros(p.shape, ctx=w.ctx) for p in w.trainable]   # c_i
            self.variate_sum = [nd.zeros(p.shape, ctx=w.ctx) for p in w.trainable]
            self.correction = [nd.zeros(p.shape, ctx=w.ctx) for p in w.trainable]  # c - c_i
        self.client = self.reporter = None
        self.where = None                    # (host, device) as announced: for later hellos
        self.speed_announcer = None          # made at the first speed change
        self.next_k = 1                      # planned policy: k_i of the coming round
        self.round_budget = 0.0              # ... and the others' planned computing in it
        self.round_computed = 0.0            # ... and this worker's computing so far
        self.round_planned = None            # ... the k this round was planned for (logged)
        self.plan_sent = None                # round whose plan rank 0 wrote into the last push
        self.reported = None                 # rank 0: the control sum it reported last round
        self.pending = None                  # --overlap: the exchange under way
        self.last_comm = 0.0                 # seconds the last finished exchange took
        self.was_slowest = False             # the slowest by the last exchange's durations
        self.last_overhead = 0.0             # seconds the last aggregation computed (not waited)
        self.round_waited = 0.0              # this aggregation's blocking waits so far
        self.questions = None                # dynamic policy: the thread that asks the server
        self.carried_in = 0                  # --carry: iterations of this round run during the
                                             # last exchange (part of this round's delta)
        self.carried_seconds = 0.0           # --carry: how long they took
        if cfg.local_iters:
            return
        self.client = StateClient(cfg.state_url, job=cfg.job, token=cfg.state_token)
        if cfg.policy == "dynamic":
            # The dynamic policy's questions go through one thread of their own, in order: the
            # slowest sends its first question of a round without waiting for the answer. It
            # is the host's network work, outside the device's CPU cap.
            with communication_threads():
                self.questions = ThreadPoolExecutor(1, thread_name_prefix="esync-questions")
                self.questions.submit(int).result()       # the thread starts now
        self.asker = ReadinessAsker(
            self.client, w.rank, call=self._ask if self.questions is not None else None,
            submit=self.questions.submit if self.questions is not None else None)
        if w.rank == 0:
            # Before the KVStore barrier in init: no worker reports before the job exists.
            self.client.init(w.num_workers, epsilon=cfg.epsilon, policy=cfg.policy,
                             sizing=RoundSizing(cfg.comm_share, cfg.max_round_seconds,
                                                cfg.overlap))
            if cfg.policy == "planned":
                with communication_threads():             # its thread: outside the CPU cap
                    self.reporter = PlanReporter(
                        StateClient(cfg.state_url, job=cfg.job, token=cfg.state_token))

    def state_arrays(self) -> dict:
        """The outer optimizer's buffers and SCAFFOLD's global variate: checkpointed, and rank
        0's reach every worker on start."""
        state = {}
        if self.outer.has_state:
            state.update({MOMENTUM_STATE.format(i): b for i, b in enumerate(self.momentum)})
        if self.outer.adam:
            state.update({VARIANCE_STATE.format(i): v for i, v in enumerate(self.variance)})
        if self.variate is not None:
            state.update({SCAFFOLD_STATE.format(i): c for i, c in enumerate(self.variate)})
        return state

    def saved_state(self) -> dict:
        """As ``state_arrays``, the outer momentum as its buffer (the kernels hold gl times it:
        ``setup``)."""
        gl = self.config.global_lr
        momentum = ({MOMENTUM_STATE.format(i) for i in range(len(self.momentum))}
                    if self.outer.scaled_state else set())
        return {name: (self.outer.buffer_from(a, gl) if name in momentum else a).asnumpy()
                for name, a in self.state_arrays().items()}

    def extra_keys(self) -> list:
        """--comm-dtype float16: the deltas on keys of that type (the model's own keys stay
        float32: they carry rank 0's initial model and checkpointed state); SCAFFOLD: the
        changes of each worker's variate. One key per parameter each."""
        shapes = [p.shape for p in self.worker.trainable]
        wire = [(shape, self.config.comm_dtype) for shape in shapes] if self._narrow_wire else []
        variates = [(shape, "float32") for shape in shapes] if self.config.scaffold else []
        factors = ([(shape, "float32") for shape in self.lowrank.key_shapes()]
                   if self.lowrank is not None else [])
        return wire + variates + factors

    @property
    def _narrow_wire(self) -> bool:
        return self.config.comm_dtype != "float32"

    def setup(self) -> None:
        w = self.worker
        self.trainer = self.sgd(self.config.local_lr)
        self.weights = datas(w.trainable)
        self.start = [x.copy() for x in self.weights]          # the global model g
        # Where this round began: g itself, unless overlap continues from g + its own delta.
        self.round_start = ([x.copy() for x in self.weights] if self.config.overlap
                            else self.start)
        wire = self.config.comm_dtype
        self.delta_sum = [nd.zeros(x.shape, ctx=x.context, dtype=wire) for x in self.weights]
        self.gradient_sum = ([nd.zeros(x.shape, ctx=x.context) for x in self.weights]
                             if self.config.accumulate else None)
        n, extra = len(self.weights), w.keys.extra
        self.delta_keys = extra[:n] if self._narrow_wire else w.keys.trainable
        first_variate = n if self._narrow_wire else 0
        variates = n if self.config.scaffold else 0
        self.variate_keys = extra[first_variate:first_variate + variates]
        if self.lowrank is not None:
            self.lowrank.use_keys(extra[first_variate + variates:])
        self.aux = datas(w.aux)
        self.aux_sum = [nd.zeros_like(x) for x in self.aux]
        if self.outer.scaled_state:    # loaded and shared as buffers; the kernels want gl x them
            for buffer in self.momentum:
                self.outer.velocity_from(buffer, self.config.global_lr)

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

    def _ask(self, fn, *args):
        return self.questions.submit(fn, *args).result()

    def continue_local(self, k: int, last_c: float, record) -> bool:
        cfg, w = self.config, self.worker
        if cfg.local_iters:
            return k < cfg.local_iters
        if cfg.policy == "planned":
            if k == 0:
                self.round_planned, self.round_computed = self.next_k, 0.0
            else:
                self.round_computed += last_c
            return planned_continue(k, self.next_k, self.round_computed, last_c,
                                    self.round_budget)
        # Iterations carried into the round count: a worker may be ready without its own
        # (with --carry-slowest the slowest's round then ends as soon as it asks)
        return self.asker.continue_local(k + self.carried_in, last_c, w.round_no,
                                         timing=lambda: record.phase("check ready"))

    def local_step(self, record) -> None:
        with record.phase("local update"):
            if self.gradient_sum is not None:       # --accumulate: the model stays put
                for total, p in zip(self.gradient_sum, self.worker.trainable):
                    nd.elemwise_add(total, p.grad(), out=total)
                return
            if self.variate is not None:
                for p, correction in zip(self.worker.trainable, self.correction):
                    p.grad()[:] += correction
            mu = self.config.prox_mu
            if mu:
                # FedProx: the gradient of (mu/2)|w - w_start|^2 per sample, summed over the
                # batch as the loss is, pulls each local model back towards its round's start.
                pull = mu * (self.worker.batch_samples or self.config.batch_size)
                for p, begin in zip(self.worker.trainable, self.round_start):
                    p.grad()[:] += pull * (p.data() - begin)
            self.trainer.step(1)

    def aggregate(self, record, want_stop: bool) -> bool:
        """The round's exchange; also times what the aggregation computes outside its waits
        (``last_overhead``: the deltas, the outer step, the copies), which on a slow device is
        part of its round: the planned policy gives the faster devices that time to compute."""
        began, self.round_waited, self.carried_seconds = time.perf_counter(), 0.0, 0.0
        try:
            return self._aggregate(record, want_stop)
        finally:
            self.last_overhead = max(0.0, time.perf_counter() - began - self.round_waited
                                     - self.carried_seconds)

    def _aggregate(self, record, want_stop: bool) -> bool:
        if self.config.overlap:
            return self._aggregate_overlapped(record, want_stop)
        carry = self._may_carry(want_stop)
        carried = Carried(self.weights if self.gradient_sum is None else None)
        with record.phase("global update"):
            exchange = self._start_round_exchange(want_stop, carry)
        if carry:
            self._carry_through(exchange, carried, record)
        with record.phase("global update"):
            control = self._receive(exchange)
        if self.lowrank is not None:
            with record.phase("global update"):
                second = self._start_second_factors(watch=carry)
            if carry:
                self._carry_through(second, carried, record)
            with record.phase("global update"):
                self._finish_second_factors(second)
        with record.phase("global update"):
            self._end_round(control, carried)
        self.carried_in = carried.count
        self._coordinate(record, control, self.worker.round_no)
        return control.stop

    def _start_round_exchange(self, want_stop: bool, watch: bool):
        return self._send(self._round_deltas(), want_stop, watch=watch)

    def _end_round(self, control, carried: "Carried") -> None:
        """Move g by the round's sums; the next round starts from it (plus carried steps)."""
        self._apply(control, self.worker.round_no)
        self._continue_from(None, carried_from=carried.ends)

    def _may_carry(self, want_stop: bool) -> bool:
        """--carry, unless the round is the last or the local iterations are fixed: who
        carries is ``carries``."""
        cfg = self.config
        if not (cfg.carry and not want_stop and not cfg.local_iters
                and self.local_iteration is not None):
            return False
        return carries(self.worker.round_k, slowest=self.was_slowest, policy=cfg.policy,
                       told_wait=self.asker.wait, carry_slowest=cfg.carry_slowest)

    def _carrying_as_slowest(self) -> bool:
        """--carry-slowest, and this worker carries as the slowest: one iteration in the round
        and no wait announced (a device told to wait carries anyway)."""
        return (self.config.carry_slowest and self.config.policy == "dynamic"
                and self.worker.round_k <= 1 and self.asker.wait <= 0)

    def _carry_through(self, exchange: ArraysInFlight, carried: "Carried", record) -> None:
        """--carry: local iterations until ``exchange`` (watched) has arrived, from the local
        model where the round ended; they count in the next round's delta (``_continue_from``
        moves them onto the new global model). Under the dynamic policy a carried iteration may
        end after the exchange: the server sizes the next round from the slowest device's
        start, not from this one's. The planned policy's k_i fill the round after the
        exchange, so there an iteration is started only if it should end within the last
        exchange's time."""
        w = self.worker
        began = time.perf_counter()
        planned = self.config.policy == "planned"
        while not exchange.arrived():
            if planned and (time.perf_counter() - exchange.started + w.round_c
                            > (self.last_comm or 0.0)):
                break
            if carried.count == 0 and self._carrying_as_slowest():
                self.asker.begin_next_round(w.round_no + 1, w.round_c)
            carried.before_first_step()
            self.local_iteration(record)
            carried.count += 1
        self.carried_seconds += time.perf_counter() - began

    def _aggregate_overlapped(self, record, want_stop: bool) -> bool:
        """--overlap: take round r-1's sums (in flight since then), send round r's, go on.

        ``self.start`` is the global model g; the worker continues from g + its own delta of
        round r, which round r's aggregate replaces when it arrives at the end of round r+1.
        Everyone ends on the same round: the last of --max-rounds, or the round after a stop
        vote arrived (its exchange is waited for, so the final model is g everywhere)."""
        cfg, t = self.config, self.worker.round_no
        with record.phase("global update"):
            deltas = self._round_deltas()
            stop_now = bool(cfg.max_rounds and t >= cfg.max_rounds)
            control = None
            if self.pending is not None:
                control = self._finish(self.pending, t - 1)
                self._coordinate(record, control, t - 1)
                stop_now = stop_now or control.stop
            if stop_now:            # the last round: its exchange is waited for
                control = self._finish(self._send(deltas, True), t)
                self._coordinate(record, control, t)
                self.pending = None
                self._continue_from(None)
            else:
                self.pending = self._send(deltas, want_stop, watch=True)
                self._continue_from(deltas)
        return stop_now

    def _round_deltas(self) -> list:
        """This round's delta: the local model minus the point the round started from."""
        w = self.worker
        if self.gradient_sum is not None:           # --accumulate: -ll x the gradients' sum
            deltas = [total * -self.config.local_lr for total in self.gradient_sum]
            for total in self.gradient_sum:
                total[:] = 0
        else:
            deltas = [x - s for x, s in zip(self.weights, self.round_start)]
        self.dump("esync", w.round_no, delta=deltas, k=self._steps)
        return deltas

    @property
    def _steps(self) -> int:
        """Local iterations in this round's delta: the round's own and those carried into it."""
        return self.worker.round_k + self.carried_in

    def _send(self, deltas, want_stop: bool, *, watch: bool = False):
        """Start the exchange of this round's weighted deltas and batch-norm statistics."""
        w, cfg = self.worker, self.config
        push = aggregate.push_weight(cfg.aggregation, self._steps)
        factored = self.lowrank.indices if self.lowrank is not None else ()
        pushed = [d if i in factored else self._on_the_wire(d, push)
                  for i, d in enumerate(deltas)]
        extra = self._weighted_variates(deltas)
        extra_sums = self.variate_sum if extra else []
        # Pushed arrays become the keys' receive buffers (KVChannel.init): the batch-norm
        # statistics go as copies, or a forward pass would wait for an overlapped exchange.
        aux = [a.copy() for a in self.aux] if cfg.overlap or watch else self.aux
        sums, keys = self.delta_sum, self.delta_keys
        if self.lowrank is not None:          # the large deltas go as their first factors
            pushed, sums, keys = self.lowrank.first(pushed, sums, keys, push=push)
        return self.start_exchange(pushed + aux + extra,
                                   sums + self.aux_sum + extra_sums,
                                   keys + w.keys.aux + self.variate_keys[:len(extra)],
                                   want_stop,
                                   k=self._steps, c=w.round_c, plan=self._plan_to_send(),
                                   d=self.last_comm, o=self.last_overhead, watch=watch)

    def _on_the_wire(self, delta, push: float):
        """``push * delta`` as a fresh array (MXNet writes the sum into it) of the wire's type,
        in one pass where one is enough (this runs on every round of a CPU-capped device)."""
        wire = self.config.comm_dtype
        if push == 1:
            if wire == "float32" and not self.config.overlap:
                return delta         # new this round and not read again (overlap goes on from it)
            return delta.astype(wire, copy=True)
        scaled = delta * push
        return scaled if wire == "float32" else scaled.astype(wire)

    def _weighted_variates(self, deltas) -> list:
        """SCAFFOLD: c_i's new value from this round (the round's mean raw gradient), times its
        weight in the global c (``aggregate.variate_weight``): pushed; [] without."""
        if self.variate is None:
            return []
        steps = max(1, self._steps)
        scale = -1.0 / (steps * self.config.local_lr)          # (x - y_i) / (k_i lr)
        weight = aggregate.variate_weight(self.config.aggregation, steps)
        pushed = []
        for i, (c, own, d) in enumerate(zip(self.variate, self.own_variate, deltas)):
            self.own_variate[i] = own - c + d * scale
            pushed.append(self.own_variate[i] * weight)
        return pushed

    def _finish(self, exchange, t: int):
        """Wait for round t's sums and move g by them; the decoded control sum."""
        control = self._receive(exchange)
        if self.lowrank is not None:
            self._finish_second_factors(self._start_second_factors(watch=False))
        self._apply(control, t)
        return control

    def _receive(self, exchange):
        """Wait for an exchange's sums (the first, with --low-rank); the decoded control sum."""
        control = exchange.wait()
        self.round_waited += exchange.waited
        self.last_comm = exchange.seconds
        return control

    def _apply(self, control, t: int) -> None:
        """Move g (and SCAFFOLD's c, the batch-norm statistics) by round t's sums."""
        w = self.worker
        self.worker_ks = control.k          # every worker's k_i, for rank 0's TensorBoard
        if self.variate is not None:         # c <- sum_i v_i c_i / sum_i v_i
            weights = sum(aggregate.variate_weight(self.config.aggregation, max(1, k))
                          for k in control.k)
            for c, total in zip(self.variate, self.variate_sum):
                c[:] = total / weights
            self.dump("scaffold", t, c=self.variate, own=self.own_variate)
        self._move_to_aggregate(aggregate.sum_weight(self.config.aggregation, control.k))
        self.dump("global", t, model=self.start)
        for p, total in zip(w.aux, self.aux_sum):
            p.set_data(total / w.num_workers)

    def _start_second_factors(self, *, watch: bool) -> ArraysInFlight:
        """--low-rank: start the second exchange (each worker's ``M_i^T P^``); ``watch``: know
        when it has arrived without waiting (--carry computes meanwhile)."""
        arrays, outs, keys = self.lowrank.second()
        started = time.perf_counter()
        self.worker.channel.start_push_pull(keys, arrays, outs)
        return ArraysInFlight(outs, started, watch=watch)

    def _finish_second_factors(self, second: ArraysInFlight) -> None:
        """Wait for the second exchange, then the approximate sums of the compressed deltas
        into ``delta_sum``; its time counts as the exchange's."""
        second.wait()
        self.round_waited += second.waited
        self.last_comm = (self.last_comm or 0.0) + second.seconds
        self.lowrank.finish(self.delta_sum)

    def _move_to_aggregate(self, scale: float) -> None:
        """g <- g + gl * outer_step(scale * pulled sum); every worker computes the same."""
        for start, total, velocity, variance in zip(self.start, self.delta_sum, self.momentum,
                                                    self.variance):
            if self._narrow_wire:
                total = total.astype("float32")
            self.outer.update(start, total, velocity, scale=scale,
                              global_lr=self.config.global_lr, variance=variance)

    def _continue_from(self, own_deltas, carried_from=None) -> None:
        """The next round starts at g (None) or, with overlap, at g + this worker's own delta;
        with iterations carried through the exchange (``carried_from``: where the round had
        left the local model), at g + what they moved it. SCAFFOLD's per-step correction
        c - c_i is refreshed once here, not at every step."""
        # copyto, not set_data or [:] =, which take the slower path of a sliced assignment
        for i, (x, start, begin) in enumerate(zip(self.weights, self.start, self.round_start)):
            if carried_from is not None:               # in place: x - end + g
                x -= carried_from[i]
                x += start
                continue
            if own_deltas is not None:
                nd.elemwise_add(start, own_deltas[i], out=begin)
            elif begin is not start:
                start.copyto(begin)
            begin.copyto(x)
        if self.variate is not None:
            for correction, c, own in zip(self.correction, self.variate, self.own_variate):
                correction[:] = c - own

    def _plan_to_send(self):
        self.plan_sent = None
        if self.reporter is None:
            return None
        newest = self.reporter.newest()
        if newest is None:
            return None
        self.plan_sent, plan = newest
        return plan

    def _coordinate(self, record, control, t: int) -> None:
        """After round t's exchange (planned policy): take the next k, hand the round to the
        reporter. The dynamic policy only passes the exchange's duration to the next
        ``/apply/``: the next round's first call (k = 0, t = the next round) enters it, so no
        ``/reset/`` is needed.
        """
        cfg, w = self.config, self.worker
        self.reported = None
        self.was_slowest = (len(control.c) > 1 and all(c > 0 for c in control.c)
                            and slowest_rank(control.c) == w.rank)
        if self.client is None:
            return
        if cfg.policy != "planned":
            self.asker.comm = self.last_comm
            return
        if any(control.plan):
            self.next_k = max(1, control.plan[w.rank])
            self.round_budget = planned_round_budget(w.rank, control.plan, control.c)
        if self.reporter is not None:
            self.reporter.submit(t, control.k, control.c, control.d, control.o)
            self.reported = control

    def round_extras(self) -> dict:
        """The last finished exchange's duration (push to the last sum: hidden under
        --overlap when shorter than the round); the dynamic policy: the ready answer's
        ``Decision.wait``; rank 0 under the planned policy: what it reported and which round's
        plan it sent."""
        extras = {"exchange_time": round(self.last_comm or 0.0, 6),
                  "carried_iterations": self.carried_in,
                  "exchange_wait": round(self.round_waited, 6),
                  "aggregation_overhead": round(self.last_overhead, 6)}
        if self.client is not None and self.config.policy == "dynamic":
            # the state server's "ready": what the slowest still computed (--carry's cue)
            extras["slowest_rest"] = round(self.asker.wait, 6)
        if self.round_planned is not None:
            # a k below it: the device slowed down within the round (planned_continue)
            extras["planned_k"] = self.round_planned
        if self.reporter is None or self.reported is None:
            return extras
        return dict(extras, reported_k=self.reported.k, reported_c=self.reported.c,
                    reported_d=self.reported.d, reported_o=self.reported.o,
                    plan_sent_from_round=self.plan_sent)

    def global_model(self) -> dict:
        """With overlap a worker trains on g + its own delta, with --carry on g + its carried
        iterations; the shared model is g."""
        if not (self.config.overlap or self.config.carry):
            return {}
        return {id(p): g for p, g in zip(self.worker.trainable, self.start)}

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
        if self.questions is not None:
            self.questions.shutdown(wait=False)


class Carried:
    """--carry: how many local iterations ran through this round's exchanges, and the local
    model where the round had left it (copied before the first of them moves it; None when
    the iterations do not move the model, as with --accumulate)."""

    def __init__(self, weights):
        self.weights = weights
        self.count = 0
        self.ends = None

    def before_first_step(self) -> None:
        if self.ends is None and self.weights is not None:
            self.ends = [x.copy() for x in self.weights]


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
