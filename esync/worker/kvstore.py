"""The communication layer: every byte between workers goes through MXNet's KVStore (ps-lite),
or, with ``--collective allreduce``, through Horovod's ring allreduce (``esync.worker.allreduce``).

Keys are small integers in the network's own parameter order (identical in every process that
builds the same network). Pushes and pulls for all keys are issued together and waited on once,
so MXNet's engine pipelines them instead of paying one round trip per parameter.
"""
import ctypes
import os
import sys
from dataclasses import dataclass
from typing import Sequence

import mxnet as mx
import numpy as np
from mxnet import nd
from mxnet.base import _LIB, check_call


def _nbytes(array: nd.NDArray) -> int:
    return int(array.size) * np.dtype(array.dtype).itemsize


class Channel:
    """What every collective offers the algorithms: a rank, a size, ``init`` + ``pull`` (rank
    0's values reach everyone), ``start_push_pull`` (the sum over the workers arrives in
    ``outs``) and byte counters. ``KVChannel`` runs it on the parameter server;
    ``esync.worker.allreduce.AllreduceChannel`` on Horovod's ring allreduce."""

    joined_job = False      # set once this process is part of a job (see leave_job_at_once)
    name = ""               # the collective: "ps" or "allreduce"

    def __init__(self):
        self.bytes_pushed = 0
        self.bytes_pulled = 0

    @property
    def rank(self) -> int:
        raise NotImplementedError

    @property
    def num_workers(self) -> int:
        raise NotImplementedError

    def init(self, keys: Sequence[int], values: Sequence[nd.NDArray]) -> None:
        raise NotImplementedError

    def pull(self, keys: Sequence[int], outs: Sequence[nd.NDArray]) -> None:
        raise NotImplementedError

    def start_push_pull(self, keys: Sequence[int], values: Sequence[nd.NDArray],
                        outs: Sequence[nd.NDArray]) -> None:
        raise NotImplementedError

    def push_pull(self, keys: Sequence[int], values: Sequence[nd.NDArray],
                  outs: Sequence[nd.NDArray]) -> None:
        """Push `values`, pull the sums over the workers into `outs`; one wait for everything.

        `values` are scratch afterwards (the parameter server keeps them as the keys' receive
        buffers, see ``KVChannel.init``; the allreduce sums in place)."""
        self.start_push_pull(keys, values, outs)
        nd.waitall()

    def finish(self) -> None:
        """The run ended well (see KVChannel.finish)."""

    def counters(self) -> tuple[int, int]:
        return self.bytes_pushed, self.bytes_pulled


class KVChannel(Channel):
    """A KVStore plus counters of the bytes this worker pushed and pulled.

    A worker leaves a ps-lite job in one of two ways. After a successful run, ``finish()`` arms
    MXNet's exit barrier, so destroying the store waits for every worker and then stops the
    servers: the normal end of a job. Until then the barrier is off: a worker that fails, at
    whatever moment its store is destroyed (the exception unwinding, interpreter shutdown),
    never waits at the barrier for peers who are themselves blocked waiting for its next push.
    """

    name = "ps"

    def __init__(self, kvstore: mx.kv.KVStore):
        super().__init__()
        self.kv = kvstore
        if kvstore.type.startswith("dist"):
            Channel.joined_job = True
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
        """Register keys; only rank 0's values reach the server (then every worker waits).

        Copies are pushed: on CPU, MXNet's distributed store keeps the array last pushed for a
        key as that key's receive buffer (no copy), so every later pull of the key first lands
        in it. Pushing the model's own arrays would let a pull into other arrays (DC-ASGD's
        w_now) overwrite rank 0's model.
        """
        self.kv.init(list(keys), [v.copy() for v in values])

    def pull(self, keys: Sequence[int], outs: Sequence[nd.NDArray]) -> None:
        self.kv.pull(list(keys), out=list(outs))
        nd.waitall()
        self.bytes_pulled += sum(_nbytes(a) for a in outs)

    def start_push_pull(self, keys: Sequence[int], values: Sequence[nd.NDArray],
                        outs: Sequence[nd.NDArray]) -> None:
        """``push_pull`` without the wait: MXNet's engine moves the arrays in the background
        (computation on other arrays goes on); reading `outs` waits for them."""
        keys = list(keys)
        self.kv.push(keys, list(values))
        self.kv.pull(keys, out=list(outs))
        self.bytes_pushed += sum(_nbytes(a) for a in values)
        self.bytes_pulled += sum(_nbytes(a) for a in outs)


class KeyMap:
    """Stable integer keys: trainable parameters first, then auxiliary states, then control keys,
    then the algorithm's own state (e.g. ESync's outer momentum)."""

    def __init__(self, num_trainable: int, num_aux: int, num_state: int = 0,
                 num_extra: int = 0):
        self.trainable = list(range(num_trainable))
        self.aux = list(range(num_trainable, num_trainable + num_aux))
        self.control = num_trainable + num_aux        # the control vector, summed each round
        self.meta = num_trainable + num_aux + 1       # [start round, start time, samples] of rank 0
        self.state = list(range(self.meta + 1, self.meta + 1 + num_state))
        # exchanged every round besides the model (SCAFFOLD's control-variate changes)
        self.extra = list(range(self.meta + 1 + num_state,
                                self.meta + 1 + num_state + num_extra))


# -- the control vector ----------------------------------------------------------------------------
# Every aggregation also pushes one small vector; the server sums it over the workers:
#     [stop_vote, samples, k_0..k_{N-1}, c_0..c_{N-1}, plan_0..plan_{N-1}, d_0..d_{N-1},
#      o_0..o_{N-1}]
# Worker i writes its own k_i (local iterations this round), c_i (its last local iteration's
# duration), d_i (how long its previous exchange took, push to pulled sum) and o_i (the time its
# previous aggregation spent computing, outside the wait) into slot i and zeros elsewhere, so
# the sum carries every worker's values; only rank 0 writes the plan slots (ESync's planned
# policy: every worker's k for a coming round).


def control_length(num_workers: int) -> int:
    return 2 + 5 * num_workers


@dataclass(frozen=True)
class ControlSum:
    """The control vector summed over the workers, decoded."""

    stop: bool               # some worker voted to stop
    samples: int             # samples of the round over all workers
    k: list                  # every worker's k_i
    c: list                  # every worker's c_i (seconds)
    plan: list               # the plan rank 0 sent (all zeros: none)
    d: list                  # every worker's communication time of its previous exchange (s)
    o: list                  # every worker's aggregation overhead of its previous round (s)


def control_vector(num_workers: int, rank: int, *, stop: bool, samples: int, k: int = 0,
                   c: float = 0.0, plan=None, d: float = 0.0, o: float = 0.0) -> np.ndarray:
    """This worker's contribution to the summed control vector (float32, as the parameters)."""
    n = num_workers
    vector = np.zeros(control_length(n), dtype=np.float32)
    vector[0], vector[1] = (1.0 if stop else 0.0), samples
    vector[2 + rank], vector[2 + n + rank], vector[2 + 3 * n + rank] = k, c, d
    vector[2 + 4 * n + rank] = o
    if plan is not None:
        if len(plan) != n:
            raise ValueError(f"a plan has one k per worker: {len(plan)} values for {n} workers")
        vector[2 + 2 * n:2 + 3 * n] = plan
    return vector


def read_control(summed: np.ndarray, num_workers: int) -> ControlSum:
    n = num_workers
    values = np.asarray(summed, dtype=np.float64)
    return ControlSum(stop=bool(values[0] > 0), samples=int(round(values[1])),
                      k=[int(round(v)) for v in values[2:2 + n]],
                      c=[float(v) for v in values[2 + n:2 + 2 * n]],
                      plan=[int(round(v)) for v in values[2 + 2 * n:2 + 3 * n]],
                      d=[float(v) for v in values[2 + 3 * n:2 + 4 * n]],
                      o=[float(v) for v in values[2 + 4 * n:2 + 5 * n]])


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
