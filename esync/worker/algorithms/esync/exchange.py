"""One ESync round's exchange, and the models it moves: what every schedule does the same way.

A round's delta (the local rule's) goes out through the wire with the batch-norm statistics, the
local rule's own pushes (SCAFFOLD's variates) and this worker's control vector; the sums come
back; the outer step moves the global model ``g`` (``start``, identical on every rank); the next
round starts from ``g`` (``continue_from``). The schedules (``schedule``) decide when each step
happens; this class does each step, and keeps the timings the round log and the control vector
report: how long the last exchange took (``last_comm``), how long this round waited for it
(``round_waited``) and what the aggregation computed outside its waits (``last_overhead``).
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from mxnet import nd

import esync.worker.algorithms.aggregate as aggregate
from esync.coordination.rules import steady_slowest_rank
from esync.worker.algorithms.base import ArraysInFlight, datas


class RoundExchange:
    def __init__(self, algorithm, *, wire, local, outer, rounds, outlives_round: bool):
        self.algorithm, self.worker, self.config = algorithm, algorithm.worker, algorithm.config
        self.wire, self.local, self.outer, self.rounds = wire, local, outer, rounds
        self.outlives_round = outlives_round  # --overlap: the exchange runs into the next round
        self.last_comm = 0.0                 # seconds the last finished exchange took
        self.was_slowest = False             # the slowest by the last two exchanges' durations
        self.earlier_c = None                # every rank's c in the exchange before the last
        self.last_overhead = 0.0             # seconds the last aggregation computed (not waited)
        self.round_waited = 0.0              # this aggregation's blocking waits so far
        self.carried_in = 0                  # --carry: iterations of this round run during the
                                             # last exchange (part of this round's delta)
        self.carried_seconds = 0.0           # --carry: how long they took

    def setup(self, weights) -> None:
        """``weights``: the local model's arrays, once the global model is in place."""
        self.weights = weights
        self.start = [x.copy() for x in weights]          # the global model g
        # Where this round began: g itself, unless overlap continues from g + its own delta.
        self.round_start = [x.copy() for x in weights] if self.outlives_round else self.start
        self.aux = datas(self.worker.aux)
        self.aux_sum = [nd.zeros_like(x) for x in self.aux]

    @property
    def steps(self) -> int:
        """Local iterations in this round's delta: the round's own and those carried into it."""
        return self.worker.round_k + self.carried_in

    @contextmanager
    def overhead_measured(self):
        """Around an aggregation: what it computes outside its waits (``last_overhead``: the
        deltas, the outer step, the copies), which on a slow device is part of its round: the
        planned policy gives the faster devices that time to compute."""
        began, self.round_waited, self.carried_seconds = time.perf_counter(), 0.0, 0.0
        try:
            yield
        finally:
            self.last_overhead = max(0.0, time.perf_counter() - began - self.round_waited
                                     - self.carried_seconds)

    def deltas(self) -> list:
        """This round's delta: what the local rule's iterations did since the round began."""
        deltas = self.local.deltas(self.weights, self.round_start)
        self.algorithm.dump("esync", self.worker.round_no, delta=deltas, k=self.steps)
        return deltas

    def send(self, deltas, want_stop: bool, *, watch: bool = False):
        """Start the exchange of this round's weighted deltas and batch-norm statistics."""
        w = self.worker
        push = aggregate.push_weight(self.config.aggregation, self.steps)
        pushed, sums, keys = self.wire.first(deltas, push)
        extra, extra_sums, extra_keys = self.local.pushes(deltas, self.steps)
        # Pushed arrays become the keys' receive buffers (KVChannel.init): the batch-norm
        # statistics go as copies, or a forward pass would wait for an overlapped exchange.
        aux = [a.copy() for a in self.aux] if self.outlives_round or watch else self.aux
        return self.algorithm.start_exchange(
            pushed + aux + extra, sums + self.aux_sum + extra_sums,
            keys + w.keys.aux + extra_keys, want_stop, k=self.steps, c=w.round_c,
            plan=self.rounds.plan_to_send(), d=self.last_comm, o=self.last_overhead, watch=watch)

    def receive(self, exchange):
        """Wait for an exchange's sums (the first, with two); the decoded control sum."""
        control = exchange.wait()
        self.round_waited += exchange.waited
        self.last_comm = exchange.seconds
        return control

    def start_second(self, *, watch: bool) -> ArraysInFlight:
        """A wire of two exchanges: start the second; ``watch``: know when it has arrived
        without waiting (--carry computes meanwhile)."""
        arrays, outs, keys = self.wire.second()
        started = time.perf_counter()
        self.worker.channel.start_push_pull(keys, arrays, outs)
        return ArraysInFlight(outs, started, watch=watch)

    def finish_second(self, second: ArraysInFlight) -> None:
        """Wait for the second exchange; its time counts as the exchange's."""
        second.wait()
        self.round_waited += second.waited
        self.last_comm = (self.last_comm or 0.0) + second.seconds
        self.wire.finish()

    def finish(self, exchange, t: int):
        """Wait for round t's sums (every exchange of them) and move g; the control sum."""
        control = self.receive(exchange)
        if self.wire.two_exchanges:
            self.finish_second(self.start_second(watch=False))
        self.apply(control, t)
        return control

    def apply(self, control, t: int) -> None:
        """Move g (and the local rule's state, the batch-norm statistics) by round t's sums."""
        w = self.worker
        self.algorithm.worker_ks = control.k     # every worker's k_i, for rank 0's TensorBoard
        self.local.after_exchange(control, t)
        self.outer.move(self.start, self.wire.float32_sums(),
                        scale=aggregate.sum_weight(self.config.aggregation, control.k))
        self.algorithm.dump("global", t, model=self.start)
        for p, total in zip(w.aux, self.aux_sum):
            p.set_data(total / w.num_workers)

    def coordinate(self, control, t: int) -> None:
        """After round t's exchange: who was the slowest (--carry), and the round sizing's turn.

        Each rank is read as the smaller of its latest two timings, as the state server judges
        a sit-out: one stalled iteration must not make a fast device the slowest, or the slow
        device would carry and open its next round early."""
        self.was_slowest = steady_slowest_rank(control.c, self.earlier_c) == self.worker.rank
        self.earlier_c = list(control.c)
        self.rounds.after_exchange(control, t, self.last_comm)

    def continue_from(self, own_deltas, carried_from=None) -> None:
        """The next round starts at g (None) or, with overlap, at g + this worker's own delta;
        with iterations carried through the exchange (``carried_from``: where the round had
        left the local model), at g + what they moved it."""
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
        self.local.round_begins()
