"""ESync's local rule: what a worker's local iterations do, and the delta a round leaves.

- ``LocalSGD``: plain SGD steps of ``-ll`` (the original ESync); the delta is the local model
  minus where the round started. Two terms may join each step's gradient:

  - ``--prox-mu MU``: FedProx's proximal term (Li et al., "Federated Optimization in
    Heterogeneous Networks", MLSys 2020): each local step also descends
    ``(mu/2) |w - w_start|^2`` per sample, so a device running many steps on its own classes
    drifts less from the round's start; no traffic.
  - ``--scaffold``: SCAFFOLD's correction ``c - c_i`` (``esync.worker.algorithms.esync.scaffold``).

- ``Accumulated`` (``--accumulate``): the local iterations sum their gradients at the round's
  model, which stays put; the delta is ``-ll`` times that sum. A round is then one SGD step on
  all the batches every device computed in it, sized by speed as load-balanced BSP does (Chen et
  al., "Semi-dynamic load balancing", SoCC 2020): no local model drifts towards the classes of
  its shard, at one model update per round.

The interface (``LocalRule``): ``step`` after each backward pass, ``deltas`` at the round's end,
and for a rule with state of its own to exchange (SCAFFOLD's variates) the keys, pushes and
updates that go with the round's exchange.
"""
from __future__ import annotations

from mxnet import nd


class LocalRule:
    moves_model = True      # the local iterations move the local model (not so: --accumulate)

    def __init__(self, algorithm):
        self.algorithm, self.config = algorithm, algorithm.config

    def setup(self, weights) -> None:
        """Once the global model is in place (``weights``: the local model's arrays)."""

    def step(self, trainable, round_start, batch_samples: int) -> None:
        """After the backward pass of a local iteration (``round_start``: where the round
        began; ``batch_samples``: the iteration's batch)."""
        raise NotImplementedError

    def deltas(self, weights, round_start) -> list:
        """This round's delta, one array per parameter."""
        raise NotImplementedError

    def key_shapes(self) -> list:
        """``(shape, dtype)`` of the keys of the rule's own exchanged arrays."""
        return []

    def use_keys(self, keys: list) -> None:
        pass

    def state_arrays(self) -> dict:
        return {}

    def pushes(self, deltas, steps: int) -> tuple[list, list, list]:
        """What the rule pushes with the round's deltas: arrays, receive buffers, keys."""
        return [], [], []

    def after_exchange(self, control, t: int) -> None:
        """Round ``t``'s sums have arrived (before the global model moves)."""

    def round_begins(self) -> None:
        """The local model has been set to where the next round starts."""


class LocalSGD(LocalRule):
    def __init__(self, algorithm, *, variates=None):
        super().__init__(algorithm)
        self.variates = variates             # SCAFFOLD's ControlVariates, or None
        self.mu = self.config.prox_mu

    def setup(self, weights) -> None:
        self.trainer = self.algorithm.sgd(self.config.local_lr)

    def step(self, trainable, round_start, batch_samples: int) -> None:
        if self.variates is not None:
            for p, correction in zip(trainable, self.variates.correction):
                p.grad()[:] += correction
        if self.mu:
            # FedProx: the gradient of (mu/2)|w - w_start|^2 per sample, summed over the
            # batch as the loss is, pulls each local model back towards its round's start.
            pull = self.mu * (batch_samples or self.config.batch_size)
            for p, begin in zip(trainable, round_start):
                p.grad()[:] += pull * (p.data() - begin)
        self.trainer.step(1)

    def deltas(self, weights, round_start) -> list:
        return [x - s for x, s in zip(weights, round_start)]

    def key_shapes(self) -> list:
        return self.variates.key_shapes() if self.variates is not None else []

    def use_keys(self, keys: list) -> None:
        if self.variates is not None:
            self.variates.use_keys(keys)

    def state_arrays(self) -> dict:
        return self.variates.state_arrays() if self.variates is not None else {}

    def pushes(self, deltas, steps: int) -> tuple[list, list, list]:
        if self.variates is None:
            return [], [], []
        return self.variates.pushes(deltas, steps)

    def after_exchange(self, control, t: int) -> None:
        if self.variates is not None:
            self.variates.apply(control, t, dump=self.algorithm.dump)

    def round_begins(self) -> None:
        if self.variates is not None:
            self.variates.refresh_correction()


class Accumulated(LocalRule):
    moves_model = False

    def setup(self, weights) -> None:
        self.gradient_sum = [nd.zeros(x.shape, ctx=x.context) for x in weights]

    def step(self, trainable, round_start, batch_samples: int) -> None:
        for total, p in zip(self.gradient_sum, trainable):
            nd.elemwise_add(total, p.grad(), out=total)

    def deltas(self, weights, round_start) -> list:
        """-ll x the gradients' sum; the sum starts again from zero."""
        deltas = [total * -self.config.local_lr for total in self.gradient_sum]
        for total in self.gradient_sum:
            total[:] = 0
        return deltas
