"""ESync's wire: what a round's deltas travel as, and the sums they come back as.

- ``FullDeltas``: every delta in full, float32 on the model's own keys, or with
  ``--comm-dtype float16`` as half floats on keys of their own (half the bytes; the global model
  and the outer step stay float32, and so do the model's keys, which carry rank 0's initial
  model and checkpointed state).
- ``FactoredDeltas`` (``--low-rank R``): each large delta travels as two rank-R factors
  (PowerSGD with error feedback, ``esync.worker.algorithms.lowrank``): the first exchange
  carries the small arrays in full and each ``M_i Q``, a second one each ``M_i^T P^``; a few
  percent of the bytes, for slow links.

The interface: the keys it needs besides the model's (``delta_key_shapes`` for the deltas,
``factor_key_shapes`` for factors), ``setup`` once they exist, ``first`` (the first exchange's
arrays, receive buffers and keys), ``second`` and ``finish`` when ``two_exchanges``, and
``float32_sums`` for the outer step.
"""
from __future__ import annotations

from mxnet import nd

from esync.worker.algorithms.lowrank import LowRankWire


class FullDeltas:
    two_exchanges = False

    def __init__(self, shapes, dtype: str, *, reads_deltas_after_push: bool):
        self.shapes, self.dtype = list(shapes), dtype
        # --overlap goes on from the deltas it pushed: they cannot be the receive buffers
        self.reads_deltas_after_push = reads_deltas_after_push
        self.sums = self.keys = []

    @property
    def narrow(self) -> bool:
        return self.dtype != "float32"

    def delta_key_shapes(self) -> list:
        """``(shape, dtype)`` of the keys the deltas travel on, where not the model's own."""
        return [(shape, self.dtype) for shape in self.shapes] if self.narrow else []

    def factor_key_shapes(self) -> list:
        return []

    def setup(self, weights, *, model_keys, delta_keys, factor_keys) -> None:
        self.sums = [nd.zeros(x.shape, ctx=x.context, dtype=self.dtype) for x in weights]
        self.keys = delta_keys if self.narrow else model_keys

    def first(self, deltas, push: float) -> tuple[list, list, list]:
        """The first exchange's arrays (each delta weighted by ``push``), buffers and keys."""
        return [self.on_the_wire(d, push) for d in deltas], self.sums, self.keys

    def on_the_wire(self, delta, push: float):
        """``push * delta`` as a fresh array (MXNet writes the sum into it) of the wire's type,
        in one pass where one is enough (this runs on every round of a CPU-capped device)."""
        if push == 1:
            if not self.narrow and not self.reads_deltas_after_push:
                return delta         # new this round and not read again
            return delta.astype(self.dtype, copy=True)
        scaled = delta * push
        return scaled if not self.narrow else scaled.astype(self.dtype)

    def second(self) -> tuple[list, list, list]:
        raise NotImplementedError("full deltas travel in one exchange")

    def finish(self) -> None:
        """Once every exchange is in: ``sums`` hold the sums of the deltas."""

    def float32_sums(self):
        """The summed deltas as the outer step takes them, converted one at a time."""
        return (total.astype("float32") if self.narrow else total for total in self.sums)


class FactoredDeltas(FullDeltas):
    two_exchanges = True

    def __init__(self, shapes, dtype: str, *, rank: int, ctx, reads_deltas_after_push: bool):
        super().__init__(shapes, dtype, reads_deltas_after_push=reads_deltas_after_push)
        self.factors = LowRankWire(self.shapes, rank, ctx)

    def factor_key_shapes(self) -> list:
        return [(shape, "float32") for shape in self.factors.key_shapes()]

    def setup(self, weights, *, model_keys, delta_keys, factor_keys) -> None:
        super().setup(weights, model_keys=model_keys, delta_keys=delta_keys,
                      factor_keys=factor_keys)
        self.factors.use_keys(factor_keys)

    def first(self, deltas, push: float) -> tuple[list, list, list]:
        """The small deltas as ``FullDeltas`` sends them; each large one as its first factor
        (``LowRankWire.first`` weights it by ``push`` as it adds the residual)."""
        factored = self.factors.indices
        pushed = [d if i in factored else self.on_the_wire(d, push)
                  for i, d in enumerate(deltas)]
        return self.factors.first(pushed, self.sums, self.keys, push=push)

    def second(self) -> tuple[list, list, list]:
        """Once the first sums are in: each worker's ``M_i^T P^``, their buffers and keys."""
        return self.factors.second()

    def finish(self) -> None:
        """The approximate sums of the factored deltas into ``sums``."""
        self.factors.finish(self.sums)
