"""The communication layer: every byte between workers goes through MXNet's KVStore (ps-lite).

Keys are small integers in the network's own parameter order (identical in every process that
builds the same network). Pushes and pulls for all keys are issued together and waited on once,
so MXNet's engine pipelines them instead of paying one round trip per parameter.
"""
from typing import Sequence

import mxnet as mx
import numpy as np
from mxnet import nd


def _nbytes(array: nd.NDArray) -> int:
    return int(array.size) * np.dtype(array.dtype).itemsize


class KVChannel:
    """A KVStore plus counters of the bytes this worker pushed and pulled."""

    def __init__(self, kvstore: mx.kv.KVStore):
        self.kv = kvstore
        self.bytes_pushed = 0
        self.bytes_pulled = 0

    @property
    def rank(self) -> int:
        return self.kv.rank

    @property
    def num_workers(self) -> int:
        return self.kv.num_workers

    def init(self, keys: Sequence[int], values: Sequence[nd.NDArray]) -> None:
        """Register keys; only rank 0's values reach the server (then every worker waits)."""
        self.kv.init(list(keys), list(values))

    def pull(self, keys: Sequence[int], outs: Sequence[nd.NDArray]) -> None:
        self.kv.pull(list(keys), out=list(outs))
        nd.waitall()
        self.bytes_pulled += sum(_nbytes(a) for a in outs)

    def push_pull(self, keys: Sequence[int], values: Sequence[nd.NDArray],
                  outs: Sequence[nd.NDArray]) -> None:
        """Push `values`, pull the aggregated results into `outs`; one wait for everything."""
        keys = list(keys)
        self.kv.push(keys, list(values))
        self.kv.pull(keys, out=list(outs))
        nd.waitall()
        self.bytes_pushed += sum(_nbytes(a) for a in values)
        self.bytes_pulled += sum(_nbytes(a) for a in outs)

    def counters(self) -> tuple[int, int]:
        return self.bytes_pushed, self.bytes_pulled


class KeyMap:
    """Stable integer keys: trainable parameters first, then auxiliary states, then control keys."""

    def __init__(self, num_trainable: int, num_aux: int):
        self.trainable = list(range(num_trainable))
        self.aux = list(range(num_trainable, num_trainable + num_aux))
        self.control = num_trainable + num_aux        # [stop votes, samples] summed each round
        self.meta = num_trainable + num_aux + 1       # [start round, start time] set by rank 0
