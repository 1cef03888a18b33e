"""The interface every synchronization algorithm implements.

The training loop (``esync.trainer``) exists once; an algorithm only fills in these hooks:

    prepare()                 before the parameter server's keys are created (optimizer, state server)
    announce(host, device)    once the job exists everywhere: say where this worker runs (dashboard)
    continue_local(k, c, rec) True while this worker should run another local iteration this round
    local_step(rec)           after the backward pass of each local iteration
    aggregate(rec, want_stop) end of the round: exchange with the other workers; returns "stop now"

``Worker`` carries what every algorithm needs (network, parameters, KVStore channel, rank).
"""
from dataclasses import dataclass, field
from typing import Optional

import mxnet as mx
from mxnet import gluon, nd

from esync.kvstore import KeyMap, KVChannel
from esync.measure import RoundRecord


@dataclass
class Worker:
    args: object                     # the resolved argparse namespace (read only)
    ctx: mx.Context
    net: gluon.HybridBlock
    trainable: list                  # gluon Parameters with gradients
    aux: list                        # auxiliary states (batch-norm running mean/var)
    channel: Optional[KVChannel] = None
    keys: Optional[KeyMap] = None
    rank: int = 0
    num_workers: int = 1
    samples_this_round: int = field(default=0)


class Algorithm:
    """Base class; subclasses set the class attributes and override hooks where they differ."""

    kvstore_type: Optional[str] = None   # 'dist_sync', 'dist_async' or None (standalone)
    collective_stop = False             # stop decided together, through the parameter server
    global_samples: Optional[int] = None   # samples of the last round over all workers, if known
    worker_ks: Optional[list] = None       # every worker's k_i of the last round, if the exchange
                                           # carries them (else only this worker's k is known)

    def __init__(self, worker: Worker):
        self.worker = worker
        self.args = worker.args

    # -- hooks -------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Runs before the KVStore keys are created (and before the first barrier)."""

    def setup(self) -> None:
        """Runs once the global model is in place, before the first round."""

    def announce(self, *, host: str, device: str) -> None:
        """Runs after setup: tell a coordinator, if the algorithm has one, where this worker runs."""

    def continue_local(self, k: int, last_c: float, record: RoundRecord) -> bool:
        return k == 0

    def local_step(self, record: RoundRecord) -> None:
        """Default: nothing (the update happens at aggregation)."""

    def aggregate(self, record: RoundRecord, want_stop: bool) -> bool:
        return want_stop

    def state_requests(self) -> int:
        return 0

    def close(self) -> None:
        pass

    # -- helpers shared by the algorithms ----------------------------------------------------
    def sgd(self, learning_rate: float) -> gluon.Trainer:
        """Plain SGD applied locally (no KVStore inside gluon's Trainer).

        The loss is a per-sample vector and ``backward()`` sums its gradients over the batch, so
        ``step(1)`` moves by ``learning_rate`` x the gradient summed over the batch: the
        original ESync's meaning of ``-l``/``-ll``.
        """
        return gluon.Trainer(self.worker.trainable, "sgd", {"learning_rate": learning_rate},
                             kvstore=None)

    def exchange(self, arrays: list, outs: list, keys: list, want_stop: bool) -> bool:
        """Push `arrays` and a [stop vote, samples] control vector, pull the sums, one wait.

        Returns True when any worker voted to stop; the global number of samples of the round is
        left in ``self.global_samples``.
        """
        w = self.worker
        control = nd.array([1.0 if want_stop else 0.0, w.samples_this_round], ctx=w.ctx)
        control_sum = nd.zeros(2, ctx=w.ctx)
        w.channel.push_pull(keys + [w.keys.control], arrays + [control], outs + [control_sum])
        votes, samples = control_sum.asnumpy()
        self.global_samples = int(samples)
        return votes > 0


def grads(params: list) -> list:
    return [p.grad(p.list_ctx()[0]) for p in params]


def datas(params: list) -> list:
    return [p.data(p.list_ctx()[0]) for p in params]
