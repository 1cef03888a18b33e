"""The communication layer: every byte between workers goes through MXNet's KVStore (ps-lite).

Keys are small integers in the network's own parameter order (identical in every process that
builds the same network). Pushes and pulls for all keys are issued together and waited on once,
so MXNet's engine pipelines them instead of paying one round trip per parameter.
"""
import ctypes
import os
import sys
from typing import Sequence

import mxnet as mx
import numpy as np
from mxnet import nd
from mxnet.base import _LIB, check_call


def _nbytes(array: nd.NDArray) -> int:
    return int(array.size) * np.dtype(array.dtype).itemsize


class KVChannel:
    """A KVStore plus counters of the bytes this worker pushed and pulled.

    A worker leaves a ps-lite job in one of two ways. After a successful run, ``finish()`` arms
    MXNet's exit barrier, so destroying the store waits for every worker and then stops the
    servers: the normal end of a job. Until then the barrier is off: a worker that fails, at
    whatever moment its store is destroyed (the exception unwinding, interpreter shutdown),
    never waits at the barrier for peers who are themselves blocked waiting for its next push.
    """

    joined_job = False      # set once this process is a ps-lite worker (see leave_job_at_once)

    def __init__(self, kvstore: mx.kv.KVStore):
        self.kv = kvstore
        self.bytes_pushed = 0
        self.bytes_pulled = 0
        if kvstore.type.startswith("dist"):
            KVChannel.joined_job = True
            _set_barrier_before_exit(kvstore, False)

    def finish(self) -> None:
        """The run ended well: leave the job together with the other workers (see above)."""
        if self.kv.type.startswith("dist"):
            _set_barrier_before_exit(self.kv, True)

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


def _set_barrier_before_exit(kvstore: mx.kv.KVStore, on: bool) -> None:
    """MXNet's C API switch (no Python wrapper in 1.9) for the barrier in the store's destructor."""
    check_call(_LIB.MXKVStoreSetBarrierBeforeExit(kvstore.handle, ctypes.c_int(int(on))))


def leave_job_at_once(code: int) -> None:
    """End a failed ps-lite worker now, with `code`, without waiting for its peers.

    The store's exit barrier is already off (see KVChannel), but a store still alive at exit
    would first wait for the engine, and a pull the server holds back until the blocked peers
    push never completes. So the output is flushed (the error is already printed) and the
    process ends without running destructors; the launcher sees the exit and stops the rest.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
