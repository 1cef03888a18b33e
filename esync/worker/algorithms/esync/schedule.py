"""ESync's schedule: when a round's exchange runs against the local computation.

- ``Blocking``: the round's exchange is waited for; the next round starts from the new ``g``.
- ``Carrying`` (``--carry``): a device that ran two or more iterations in a round (so at least
  twice as fast as the slowest), or that the state server's "ready" told the slowest still
  computes (``Decision.wait``), keeps iterating while the round's exchange is in flight, from
  where its local model stands, and carries those iterations into its next delta (counted in
  its next ``k_i``, and in its first question of the next round): when the exchange ends, its
  local model becomes ``g`` plus what they moved it. The global model is not delayed (unlike
  ``--overlap``); a device's wait for the slowest's push and for the transfer becomes
  computing. With ``--carry-slowest`` (dynamic policy) the slowest device carries too, and is
  ready as soon as it asks after the exchange.
- ``Overlapped`` (``--overlap``): the exchange of round r runs while round r+1 computes. The
  global model ``g`` (identical on every rank) moves one round late, when round r's sum arrives
  at the end of round r+1; meanwhile each worker continues from ``g`` plus its own fresh delta
  (the "eager" variant of Streaming DiLoCo), so one worker alone is exactly local SGD
  (docs/ALGORITHM.md has the maths).

The interface: ``aggregate(record, want_stop)`` runs the round's end and returns "stop now";
``global_model_differs``: the worker trains on something other than ``g``;
``exchange_outlives_round``: the exchange runs into the next round.
"""
from __future__ import annotations

import time

from esync.worker.algorithms.base import ArraysInFlight


def carries(round_k: int, *, slowest: bool, policy: str, told_wait: float,
            carry_slowest: bool) -> bool:
    """Whether a worker with --carry computes through this round's exchange.

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


class Blocking:
    global_model_differs = False
    exchange_outlives_round = False

    def __init__(self, algorithm, exchange):
        self.algorithm, self.exchange = algorithm, exchange
        self.worker, self.config = algorithm.worker, algorithm.config

    def may_carry(self, want_stop: bool) -> bool:
        return False

    def carry_through(self, exchange: ArraysInFlight, carried: Carried, record) -> None:
        raise NotImplementedError("only --carry computes through an exchange")

    def aggregate(self, record, want_stop: bool) -> bool:
        ex = self.exchange
        carry = self.may_carry(want_stop)
        carried = Carried(ex.weights if ex.local.moves_model else None)
        with record.phase("global update"):
            exchange = ex.send(ex.deltas(), want_stop, watch=carry)
        if carry:
            self.carry_through(exchange, carried, record)
        with record.phase("global update"):
            control = ex.receive(exchange)
        if ex.wire.two_exchanges:
            with record.phase("global update"):
                second = ex.start_second(watch=carry)
            if carry:
                self.carry_through(second, carried, record)
            with record.phase("global update"):
                ex.finish_second(second)
        with record.phase("global update"):
            # g moves by the round's sums; the next round starts from it (plus carried steps)
            ex.apply(control, self.worker.round_no)
            ex.continue_from(None, carried_from=carried.ends)
        ex.carried_in = carried.count
        ex.coordinate(control, self.worker.round_no)
        return control.stop


class Carrying(Blocking):
    global_model_differs = True         # a worker trains on g + its carried iterations

    def may_carry(self, want_stop: bool) -> bool:
        """Unless the round is the last or the local iterations are fixed: who carries is
        ``carries``."""
        cfg = self.config
        if (want_stop or cfg.local_iters or self.algorithm.local_iteration is None
                or self.exchange.rounds.sitting_out):
            return False
        return carries(self.worker.round_k, slowest=self.exchange.was_slowest,
                       policy=cfg.policy, told_wait=self.exchange.rounds.told_wait,
                       carry_slowest=cfg.carry_slowest)

    def _carrying_as_slowest(self) -> bool:
        """--carry-slowest, and this worker carries as the slowest: one iteration in the round
        and no wait announced (a device told to wait carries anyway)."""
        return (self.config.carry_slowest and self.config.policy == "dynamic"
                and self.worker.round_k <= 1 and self.exchange.rounds.told_wait <= 0)

    def carry_through(self, exchange: ArraysInFlight, carried: Carried, record) -> None:
        """Local iterations until ``exchange`` (watched) has arrived, from the local model
        where the round ended; they count in the next round's delta (``continue_from`` moves
        them onto the new global model). Under the dynamic policy a carried iteration may end
        after the exchange: the server sizes the next round from the slowest device's start,
        not from this one's. The planned policy's k_i fill the round after the exchange, so
        there an iteration is started only if it should end within the last exchange's time."""
        w, ex = self.worker, self.exchange
        began = time.perf_counter()
        planned = self.config.policy == "planned"
        while not exchange.arrived():
            if planned and (time.perf_counter() - exchange.started + w.round_c
                            > (ex.last_comm or 0.0)):
                break
            if carried.count == 0 and self._carrying_as_slowest():
                ex.rounds.begin_next_round(w.round_no + 1, w.round_c)
            carried.before_first_step()
            self.algorithm.local_iteration(record)
            carried.count += 1
        ex.carried_seconds += time.perf_counter() - began


class Overlapped(Blocking):
    global_model_differs = True         # a worker trains on g + its own delta
    exchange_outlives_round = True

    def __init__(self, algorithm, exchange):
        super().__init__(algorithm, exchange)
        self.pending = None                  # the exchange under way

    def aggregate(self, record, want_stop: bool) -> bool:
        """Take round r-1's sums (in flight since then), send round r's, go on.

        ``exchange.start`` is the global model g; the worker continues from g + its own delta
        of round r, which round r's aggregate replaces when it arrives at the end of round r+1.
        Everyone ends on the same round: the last of --max-rounds, or the round after a stop
        vote arrived (its exchange is waited for, so the final model is g everywhere)."""
        ex, t = self.exchange, self.worker.round_no
        with record.phase("global update"):
            deltas = ex.deltas()
            stop_now = bool(self.config.max_rounds and t >= self.config.max_rounds)
            if self.pending is not None:
                control = ex.finish(self.pending, t - 1)
                ex.coordinate(control, t - 1)
                stop_now = stop_now or control.stop
            if stop_now:            # the last round: its exchange is waited for
                control = ex.finish(ex.send(deltas, True), t)
                ex.coordinate(control, t)
                self.pending = None
                ex.continue_from(None)
            else:
                self.pending = ex.send(deltas, want_stop, watch=True)
                ex.continue_from(deltas)
        return stop_now
