"""SCAFFOLD's control variates for ESync's local SGD (``--scaffold``; Karimireddy et al., ICML
2020, option II).

Each local step descends ``g + c - c_i`` (``c`` the global variate, the same on every rank;
``c_i`` this worker's); after a round ``c_i <- c_i - c + (x - y_i) / (k_i * lr)`` (``x`` the
round's start, ``y_i`` the local model: the round's mean raw gradient). ``c`` is the mean of the
``c_i`` weighted as the rule weights their corrections (``aggregate.variate_weight``: with
unequal ``k_i`` the published plain mean leaves the fast workers' corrections in the global
step), and the weighted ``c_i`` travel with the deltas through keys of their own: twice the
traffic of a round.
"""
from __future__ import annotations

from mxnet import nd

import esync.worker.algorithms.aggregate as aggregate

SCAFFOLD_STATE = "scaffold_c.{}"         # checkpoint names of SCAFFOLD's global control variate


class ControlVariates:
    def __init__(self, shapes, ctx, *, aggregation: str, local_lr: float):
        self.shapes = list(shapes)
        self.aggregation, self.local_lr = aggregation, local_lr
        self.variate = [nd.zeros(shape, ctx=ctx) for shape in self.shapes]       # c
        self.own_variate = [nd.zeros(shape, ctx=ctx) for shape in self.shapes]   # c_i
        self.variate_sum = [nd.zeros(shape, ctx=ctx) for shape in self.shapes]
        self.correction = [nd.zeros(shape, ctx=ctx) for shape in self.shapes]    # c - c_i
        self.keys = []

    def key_shapes(self) -> list:
        """One key per parameter for the changes of each worker's variate."""
        return [(shape, "float32") for shape in self.shapes]

    def use_keys(self, keys: list) -> None:
        self.keys = list(keys)

    def state_arrays(self) -> dict:
        """The global variate: checkpointed, and rank 0's reaches every worker on start."""
        return {SCAFFOLD_STATE.format(i): c for i, c in enumerate(self.variate)}

    def pushes(self, deltas, steps: int) -> tuple[list, list, list]:
        """c_i's new value from this round (the round's mean raw gradient), times its weight in
        the global c (``aggregate.variate_weight``): the arrays, their buffers and keys."""
        steps = max(1, steps)
        scale = -1.0 / (steps * self.local_lr)                  # (x - y_i) / (k_i lr)
        weight = aggregate.variate_weight(self.aggregation, steps)
        pushed = []
        for i, (c, own, d) in enumerate(zip(self.variate, self.own_variate, deltas)):
            self.own_variate[i] = own - c + d * scale
            pushed.append(self.own_variate[i] * weight)
        return pushed, self.variate_sum, self.keys[:len(pushed)]

    def apply(self, control, t: int, *, dump) -> None:
        """c <- sum_i v_i c_i / sum_i v_i, from the round's sums and every worker's k_i."""
        weights = sum(aggregate.variate_weight(self.aggregation, max(1, k)) for k in control.k)
        for c, total in zip(self.variate, self.variate_sum):
            c[:] = total / weights
        dump("scaffold", t, c=self.variate, own=self.own_variate)

    def refresh_correction(self) -> None:
        """The per-step correction c - c_i, refreshed once a round, not at every step."""
        for correction, c, own in zip(self.correction, self.variate, self.own_variate):
            correction[:] = c - own
