"""ESync's outer step: how the summed deltas of a round move the global model ``g``.

The maths is pure and lives in ``esync.worker.algorithms.aggregate`` (the rule of
``--aggregation``, the outer momentum of ``--outer-momentum``/``--nesterov``, Adam's of
``--outer-adam``); this part holds the optimizer's buffers on the worker's device, which every
rank computes alike from the same sums, and names them for checkpoints.
"""
from __future__ import annotations

from mxnet import nd

import esync.worker.algorithms.aggregate as aggregate

MOMENTUM_STATE = "outer_momentum.{}"     # checkpoint names of the outer optimizer's buffers
VARIANCE_STATE = "outer_variance.{}"     # ... and of Adam's second moments (--outer-adam)


class OuterStep:
    def __init__(self, config, shapes, ctx):
        self.global_lr = config.global_lr
        self.optimizer = aggregate.OuterOptimizer(
            momentum=config.outer_momentum, nesterov=config.nesterov, adam=config.outer_adam,
            beta2=config.outer_beta2, epsilon=config.outer_epsilon)
        # The outer momentum: buffers until ``setup``, then the fused kernels' gl x buffer;
        # under Adam its first moment, and ``variance`` its second (kept as they are)
        self.momentum = ([nd.zeros(shape, ctx=ctx) for shape in shapes]
                         if self.optimizer.has_state else [None] * len(shapes))
        self.variance = ([nd.zeros(shape, ctx=ctx) for shape in shapes]
                         if self.optimizer.adam else [None] * len(shapes))

    def state_arrays(self) -> dict:
        """The buffers, checkpointed; rank 0's reach every worker on start."""
        state = {}
        if self.optimizer.has_state:
            state.update({MOMENTUM_STATE.format(i): b for i, b in enumerate(self.momentum)})
        if self.optimizer.adam:
            state.update({VARIANCE_STATE.format(i): v for i, v in enumerate(self.variance)})
        return state

    def saved_state(self) -> dict:
        """As ``state_arrays``, in numpy, the outer momentum as its buffer (the kernels hold gl
        times it: ``setup``)."""
        momentum = ({MOMENTUM_STATE.format(i) for i in range(len(self.momentum))}
                    if self.optimizer.scaled_state else set())
        return {name: (self.optimizer.buffer_from(a, self.global_lr) if name in momentum
                       else a).asnumpy()
                for name, a in self.state_arrays().items()}

    def setup(self) -> None:
        """Once the buffers are loaded and shared (as buffers): the kernels want gl x them."""
        if self.optimizer.scaled_state:
            for buffer in self.momentum:
                self.optimizer.velocity_from(buffer, self.global_lr)

    def move(self, starts, sums, *, scale: float) -> None:
        """g <- g + gl * outer_step(scale * pulled sum), one parameter at a time (``sums`` may
        be a generator: each sum is made float32 as its turn comes)."""
        for start, total, velocity, variance in zip(starts, sums, self.momentum, self.variance):
            self.optimizer.update(start, total, velocity, scale=scale,
                                  global_lr=self.global_lr, variance=variance)
