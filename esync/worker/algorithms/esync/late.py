"""ESync's late devices: a device too slow to wait for computes its iteration while the others'
rounds go on, and its delta joins the round in which it arrives.

The state server decides who runs late (``esync.coordination.rules.late_ranks``: an iteration
longer than 16 of the fastest device's) and says so with the worker's "ready"
(``Decision.late``); from its next round on the others' rounds are bounded by the fast devices'
time. Every round's exchange still needs a push from every worker (a ``dist_sync`` KVStore sums
a key once every worker pushed it), so while the late device computes, a *stand-in* thread
pushes for it: an empty delta (k = 0, which the weighted aggregation gives no weight) and its
batch-norm statistics, on the host's context (outside the device's CPU cap, as the network stack
of a real device runs on its host), and moves a host copy of the global model and of the outer
optimizer's buffers by each round's sums, exactly as every other worker moves its own. When the
iteration ends, the stand-in finishes the exchange it has in flight, the worker installs the
newest model, and pushes its delta, computed against the model it started from and scaled by
``late_weight`` of the rounds it missed; its next iteration starts from the newest model.

``LateRounds`` is the part the schedule asks (``active``, ``aggregate``); ``can_run_late`` says
which configurations support it (the rank 0 worker tells the state server when it creates the
job, so that a configuration without it never has a device left out of the round sizing).
"""
from __future__ import annotations

import threading

import mxnet as mx
from mxnet import nd

import esync.worker.algorithms.aggregate as aggregate
from esync.coordination.rules import late_weight
from esync.worker.kvstore import control_vector, read_control


def can_run_late(config, channel) -> bool:
    """Whether a worker can run late: the dynamic policy's rounds, deltas weighted by their
    iterations (an empty push then weighs nothing), float32 deltas in one exchange, plain local
    SGD (no variates of its own to exchange) and no overlap, over the parameter server."""
    return (config.policy == "dynamic" and not config.local_iters
            and config.aggregation == "weighted" and config.comm_dtype == "float32"
            and not config.low_rank and not config.scaffold and not config.accumulate
            and not config.overlap and getattr(channel, "name", "ps") == "ps")


class StandIn:
    """A thread that takes part in the others' rounds for this worker while it computes.

    ``start``: copies of the global model, the outer optimizer's buffers and the batch-norm
    statistics on the host; then empty pushes round after round until ``finish``, which waits
    for the exchange in flight, puts the newest model and buffers back on the device, and says
    how many rounds went by and whether one of them was the last (another worker's stop)."""

    def __init__(self, algorithm, exchange, outer, host=None):
        self.worker, self.config = algorithm.worker, algorithm.config
        self.exchange, self.outer = exchange, outer
        self.host = host if host is not None else mx.cpu(0)
        self.thread = None
        self.rounds, self.stopped, self.error = 0, False, None

    @property
    def running(self) -> bool:
        return self.thread is not None

    def start(self, last_c: float) -> None:
        ex, host = self.exchange, self.host
        self.c = last_c                       # the others read this worker's c from its pushes
        self.model = [x.copyto(host) for x in ex.start]
        self.sums = [nd.zeros(x.shape, ctx=host) for x in self.model]
        self.twin = self.outer.copy_to(host)
        self.aux = [a.copyto(host) for a in ex.aux]
        self.aux_sums = [nd.zeros(a.shape, ctx=host) for a in self.aux]
        self.rounds, self.stopped, self.error = 0, False, None
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="esync-stand-in", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self._done.is_set():
                if self._one_round():
                    self.stopped = True
                    return
        except BaseException as exc:          # raised again in the training thread (finish)
            self.error = exc

    def _one_round(self) -> bool:
        """One of the others' rounds: an empty push, the sums, the host model moved; True
        when the round was the last (the others stop after it)."""
        w, host = self.worker, self.host
        n = w.num_workers
        # Fresh arrays each round: a pushed array becomes its key's receive buffer.
        empty = [nd.zeros(x.shape, ctx=host) for x in self.model]
        aux = [a.copy() for a in self.aux]
        control = nd.array(control_vector(n, w.rank, stop=False, samples=0, k=0, c=self.c),
                           ctx=host)
        control_sum = nd.zeros(control.shape, ctx=host)
        outs = self.sums + self.aux_sums + [control_sum]
        w.channel.start_push_pull(self.exchange.wire.keys + w.keys.aux + [w.keys.control],
                                  empty + aux + [control], outs)
        for out in outs:
            out.wait_to_read()
        summed = read_control(control_sum.asnumpy(), n)
        if sum(summed.k) > 0:
            self.twin.move(self.model, self.sums,
                           scale=aggregate.sum_weight(self.config.aggregation, summed.k))
        self.aux = [total / n for total in self.aux_sums]
        self.rounds += 1
        return summed.stop

    def finish(self) -> tuple[int, bool]:
        """Stop after the exchange in flight; the newest model is back on the device.
        Returns (rounds the stand-in took part in, whether the last of them was the last)."""
        self._done.set()
        self.thread.join()
        self.thread = None
        if self.error is not None:
            raise self.error
        ex, w = self.exchange, self.worker
        for start, newest in zip(ex.start, self.model):
            newest.copyto(start)
        self.outer.load_from(self.twin)
        for p, mean in zip(w.aux, self.aux):
            p.set_data(mean.as_in_context(w.ctx))
        return self.rounds, self.stopped


class LateRounds:
    """The late device's side of a round: a stand-in while it computes, then its late push."""

    def __init__(self, algorithm, exchange, outer):
        self.algorithm, self.worker = algorithm, algorithm.worker
        self.exchange = exchange
        self.stand_in = StandIn(algorithm, exchange, outer)
        self.missed = None                    # rounds the late push missed, until logged

    @property
    def active(self) -> bool:
        """A stand-in runs: this round's exchange is the late push."""
        return self.stand_in.running

    def begin(self, last_c: float) -> None:
        """The round's first iteration starts now, and the state server said this worker runs
        late: the stand-in takes its place in the others' rounds."""
        if not self.stand_in.running:
            self.stand_in.start(last_c)

    def aggregate(self, record, want_stop: bool) -> bool:
        """The late push: the delta against the model the iteration started from, scaled by
        ``late_weight`` of the rounds that went by; then the newest model. Returns "stop
        now" (without a push when the others stopped in a round the stand-in took part in)."""
        ex, rounds = self.exchange, self.algorithm.rounds
        with record.phase("global update"):
            deltas = ex.deltas()
            missed, stopped = self.stand_in.finish()
            self.missed = missed
            # The others' round this push is part of: this worker's round log keeps its own
            # numbering, the state server hears the others' (``RoundSizer.rounds_behind``).
            rounds.rounds_behind += missed
            t = self.worker.round_no + rounds.rounds_behind
            if stopped:
                ex.continue_from(None)
                return True
            exchange = ex.send(deltas, want_stop, scale=late_weight(missed))
            control = ex.receive(exchange)
            ex.apply(control, t)
            ex.continue_from(None)
        ex.carried_in = 0
        ex.coordinate(control, t)
        return control.stop

    def extras(self) -> dict:
        """For the round log of a late push: the rounds it missed and its weight."""
        if self.missed is None:
            return {}
        missed, self.missed = self.missed, None
        return {"late_rounds": missed, "late_weight": round(late_weight(missed), 6)}
