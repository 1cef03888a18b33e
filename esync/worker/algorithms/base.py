"""The interface every synchronization algorithm implements.

The training loop (``esync.worker.trainer``) exists once; an algorithm only fills in these hooks:

    prepare()                 before the parameter server's keys are created (optimizer, state server)
    state_arrays()            the algorithm's own state (checkpointed; rank 0's reaches everyone)
    announce(host, device, slowdown)  once the job exists everywhere: say where this worker runs
                              and its slow-down factor (dashboard)
    speed_changed(slowdown)   the device's slow-down factor in force changed (--speed-schedule):
                              tell the dashboard without holding up the round
    continue_local(k, c, rec) True while this worker should run another local iteration this round
    local_step(rec)           after the backward pass of each local iteration
    aggregate(rec, want_stop) end of the round: exchange with the other workers; returns "stop now"
    round_extras()            extra keys for this round's log
    global_model()            the shared model where it differs from the worker's parameters

and the loop sets ``local_iteration`` (one more local iteration, logged into a round record),
for an algorithm that computes while it exchanges (ESync's ``--carry``).

``Worker`` carries what every algorithm needs (network, parameters, KVStore channel, rank) and
``AlgorithmConfig`` the named values the algorithms read (never the whole command line).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import mxnet as mx
import numpy as np
from mxnet import gluon, nd

from esync.worker.kvstore import Channel, ControlSum, KeyMap, control_vector, read_control
from esync.worker.measure import RoundRecord


@dataclass(frozen=True)
class AlgorithmConfig:
    """What the algorithms need to know, by name; ``from_args`` reads it off ``main.py``'s flags."""

    learning_rate: float = 0.001          # -l: SGD step, x the batch-summed gradient
    momentum: float = 0.0                 # --momentum: the other modes' SGD momentum
    local_lr: float = 0.001               # -ll: ESync's local step, likewise
    global_lr: float = 1.0                # -gl: ESync's outer learning rate
    local_iters: int = 0                  # --local-iters: fixed k_i (0: ask the state server)
    policy: str = "dynamic"               # --policy: how the state server decides k_i
    epsilon: float | str = "auto"         # --epsilon: the state server's slack
    aggregation: str = "mean"             # --aggregation: mean, weighted, fednova or sum
    outer_momentum: float = 0.0           # --outer-momentum: 0 is none
    nesterov: bool = False                # --nesterov: Nesterov form of the outer momentum
    outer_adam: bool = False              # --outer-adam: Adam as the outer step (FedAdam)
    outer_beta2: float = 0.99             # --outer-beta2: its second moment's decay
    outer_epsilon: float = 1e-3           # --outer-epsilon: its tau
    dcasgd_lambda: float = 0.04           # --dcasgd-lambda: DC-ASGD's lambda (summed gradient)
    comm_share: float = 1.0               # --comm-share: communication's largest share of a round
    max_round_seconds: float = 0.0        # --max-round-seconds: bound on a round (0: none)
    overlap: bool = False                 # --overlap: exchange during the next round
    carry: bool = False                   # --carry: iterate during the exchange, into the next
    carry_slowest: bool = False           # --carry-slowest: the slowest device too
    sit_out_ratio: float = 0.0            # --sit-out-ratio: slower than this sits out (0: never)
    comm_dtype: str = "float32"           # --comm-dtype: the deltas' type on the wire
    prox_mu: float = 0.0                  # --prox-mu: FedProx's proximal coefficient (0: none)
    scaffold: bool = False                # --scaffold: SCAFFOLD's control variates
    low_rank: int = 0                     # --low-rank: PowerSGD rank of the deltas (0: full)
    accumulate: bool = False              # --accumulate: local iterations sum gradients
    batch_size: int = 64                  # -b: samples per local step
    max_rounds: int = 0                   # --max-rounds: the last round (0: no such bound)
    state_url: str = "http://127.0.0.1:10010"
    job: str = "default"
    state_token: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_args(cls, args) -> "AlgorithmConfig":
        return cls(learning_rate=args.learning_rate, momentum=getattr(args, "momentum", 0.0),
                   local_lr=args.local_lr,
                   global_lr=args.global_lr, local_iters=args.local_iters, policy=args.policy,
                   epsilon=args.epsilon, aggregation=args.aggregation,
                   outer_momentum=args.outer_momentum, nesterov=bool(args.nesterov),
                   outer_adam=bool(getattr(args, "outer_adam", False)),
                   outer_beta2=getattr(args, "outer_beta2", cls.outer_beta2),
                   outer_epsilon=getattr(args, "outer_epsilon", cls.outer_epsilon),
                   dcasgd_lambda=getattr(args, "dcasgd_lambda", cls.dcasgd_lambda),
                   comm_share=getattr(args, "comm_share", cls.comm_share),
                   max_round_seconds=getattr(args, "max_round_seconds", cls.max_round_seconds),
                   overlap=bool(getattr(args, "overlap", False)),
                   carry=bool(getattr(args, "carry", False)),
                   carry_slowest=bool(getattr(args, "carry_slowest", False)),
                   sit_out_ratio=getattr(args, "sit_out_ratio", 0.0) or 0.0,
                   comm_dtype=getattr(args, "comm_dtype", cls.comm_dtype),
                   prox_mu=getattr(args, "prox_mu", 0.0) or 0.0,
                   scaffold=bool(getattr(args, "scaffold", False)),
                   low_rank=getattr(args, "low_rank", 0) or 0,
                   accumulate=bool(getattr(args, "accumulate", False)),
                   batch_size=getattr(args, "batch_size", cls.batch_size),
                   max_rounds=getattr(args, "max_rounds", 0) or 0,
                   state_url=f"http://{args.state_server_ip}:{args.state_server_port}",
                   job=args.job, state_token=args.state_token)


def sgd_optimizer(learning_rate: float, momentum: float = 0.0,
                  nesterov: bool = False) -> tuple[str, dict]:
    """(MXNet optimizer name, its parameters) of SGD at ``learning_rate``: plain, heavy-ball
    ``momentum``, or Nesterov's form (``nag``: w -= lr (g + m v) with v = m v + g)."""
    if not momentum:
        return "sgd", {"learning_rate": learning_rate}
    return ("nag" if nesterov else "sgd"), {"learning_rate": learning_rate,
                                            "momentum": momentum}


@dataclass
class Worker:
    config: AlgorithmConfig
    ctx: mx.Context
    net: gluon.HybridBlock
    trainable: list                  # gluon Parameters with gradients
    aux: list                        # auxiliary states (batch-norm running mean/var)
    channel: Optional[Channel] = None    # KVChannel (ps) or AllreduceChannel
    keys: Optional[KeyMap] = None
    rank: int = 0
    num_workers: int = 1
    # Set by the training loop before each aggregation:
    round_no: int = 0                # the round under way
    round_k: int = 0                 # local iterations this worker ran in it
    round_c: float = 0.0             # duration of its last local iteration (seconds)
    samples_this_round: int = 0
    batch_samples: int = 0           # samples of the local iteration under way (the last
                                     # batch of a -s 1 pass is smaller)
    _model_arrays: Optional[list] = field(default=None, repr=False, compare=False)

    def settle(self) -> None:
        """Wait until the model (weights, gradients, batch-norm statistics) holds every value
        queued for it: what a phase timer must include, without waiting for an exchange that
        runs beside the computation (``esync.worker.measure``). The arrays are looked up once:
        training writes into them in place, and this runs twice per phase."""
        if self._model_arrays is None:
            self._model_arrays = datas(self.trainable) + grads(self.trainable) + datas(self.aux)
        for array in self._model_arrays:
            array.wait_to_read()


class Algorithm:
    """Base class; subclasses set the class attributes and override hooks where they differ."""

    kvstore_type: Optional[str] = None   # 'dist_sync', 'dist_async' or None (standalone)
    collective_stop = False             # stop decided together, through the parameter server
    global_samples: Optional[int] = None   # samples of the last round over all workers, if known
    worker_ks: Optional[list] = None       # every worker's k_i of the last round, if the exchange
                                           # carries them (else only this worker's k is known)
    local_iteration = None     # set by the training loop: runs one more local iteration into a
                               # RoundRecord, returns its seconds (ESync's --carry)
    sitting_out = False        # this worker computes nothing from its next round on (ESync's
                               # --sit-out-ratio): the training loop leaves the device's CPU cap

    def __init__(self, worker: Worker):
        self.worker = worker
        self.config = worker.config
        dump = os.environ.get(DUMP_ENV)
        self.dump_dir = Path(dump) if dump else None

    # -- hooks -------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Runs before the KVStore keys are created (and before the first barrier)."""

    def state_arrays(self) -> dict:
        """Named NDArrays of the algorithm's own state (e.g. outer momentum), updated in place:
        a checkpoint's state is loaded into them and rank 0's reach everyone before ``setup``."""
        return {}

    def saved_state(self) -> dict:
        """``state_arrays`` as a checkpoint keeps them (numpy arrays)."""
        return {name: a.asnumpy() for name, a in self.state_arrays().items()}

    def extra_keys(self) -> list:
        """``(shape, dtype)`` of each array the algorithm exchanges every round on keys of its
        own besides the model's (created with the others, zero-initialised)."""
        return []

    def setup(self) -> None:
        """Runs once the global model is in place, before the first round."""

    def announce(self, *, host: str, device: str, slowdown: float | None = None) -> None:
        """Runs after setup: tell a coordinator, if the algorithm has one, where this worker runs."""

    def speed_changed(self, slowdown: float) -> None:
        """Called between rounds when the device's slow-down factor changed; must not block
        on the network nor raise because of it (training goes on whatever the dashboard does)."""

    def continue_local(self, k: int, last_c: float, record: RoundRecord) -> bool:
        return k == 0

    def local_step(self, record: RoundRecord) -> None:
        """Default: nothing (the update happens at aggregation)."""

    def aggregate(self, record: RoundRecord, want_stop: bool) -> bool:
        return want_stop

    def round_extras(self) -> dict:
        return {}

    def state_requests(self) -> int:
        return 0

    def global_model(self) -> dict:
        """``{id(parameter): NDArray}`` where the model every rank shares differs from this
        worker's parameters (checkpoints hold the shared one); empty: they are the same."""
        return {}

    def close(self) -> None:
        pass

    # -- helpers shared by the algorithms ----------------------------------------------------
    def dump(self, tag: str, step: int, **arrays) -> None:
        """Test hook, off unless ``$ESYNC_DUMP_PUSHES`` names a folder: write the arrays this
        worker exchanges at ``step`` to ``<folder>/<tag>-rank<R>-<step>.npz`` (lists of arrays
        as ``name.0``, ``name.1``, ...), so a test can replay the rule on the real values of a
        real cluster. Costs nothing when unset; never used in runs."""
        if self.dump_dir is None:
            return
        flat = {}
        for name, value in arrays.items():
            if isinstance(value, (list, tuple)):
                flat.update({f"{name}.{i}": _numpy(v) for i, v in enumerate(value)})
            else:
                flat[name] = _numpy(value)
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        np.savez(self.dump_dir / f"{tag}-rank{self.worker.rank}-{step:06d}.npz", **flat)

    def sgd(self, learning_rate: float, *, momentum: float = 0.0,
            nesterov: bool = False) -> gluon.Trainer:
        """SGD applied locally (no KVStore inside gluon's Trainer), plain unless ``momentum``:
        heavy-ball, or Nesterov's form (MXNet's NAG) with ``nesterov``.

        The loss is a per-sample vector and ``backward()`` sums its gradients over the batch, so
        ``step(1)`` moves by ``learning_rate`` x the gradient summed over the batch: the
        original ESync's meaning of ``-l``/``-ll``.
        """
        return gluon.Trainer(self.worker.trainable, *sgd_optimizer(learning_rate, momentum,
                                                                     nesterov), kvstore=None)

    def baseline_sgd(self) -> gluon.Trainer:
        """The SGD of the modes other than ESync: ``-l`` with ``--momentum`` (``--nesterov``)."""
        c = self.config
        return self.sgd(c.learning_rate, momentum=c.momentum, nesterov=c.nesterov)

    def exchange(self, arrays: list, outs: list, keys: list, want_stop: bool, *, k: int = 0,
                 c: float = 0.0, plan=None, d: float = 0.0, o: float = 0.0) -> ControlSum:
        """Push `arrays` and this worker's control vector, pull the sums, one wait.

        The control vector (``esync.worker.kvstore.control_vector``) carries the stop vote, the samples,
        this worker's ``k``, ``c``, ``d`` and ``o`` and (rank 0) a plan; the returned sum holds
        everyone's.
        The global number of samples of the round is left in ``self.global_samples``.
        """
        return self.start_exchange(arrays, outs, keys, want_stop, k=k, c=c, plan=plan,
                                   d=d, o=o).wait()

    def start_exchange(self, arrays: list, outs: list, keys: list, want_stop: bool, *,
                       k: int = 0, c: float = 0.0, plan=None, d: float = 0.0,
                       o: float = 0.0, watch: bool = False) -> "PendingExchange":
        """``exchange`` without the wait: the arrays travel while this worker computes.
        ``watch``: time the transfer from a background thread (``PendingExchange.seconds``)."""
        w = self.worker
        control = nd.array(control_vector(w.num_workers, w.rank, stop=want_stop,
                                          samples=w.samples_this_round, k=k, c=c, plan=plan, d=d,
                                          o=o),
                           ctx=w.ctx)
        control_sum = nd.zeros(control.shape, ctx=w.ctx)
        started = time.perf_counter()
        w.channel.start_push_pull(keys + [w.keys.control], arrays + [control],
                                  outs + [control_sum])
        return PendingExchange(self, outs + [control_sum], started, watch=watch)


class ArraysInFlight:
    """Arrays an exchange will fill. ``wait()`` blocks until they are in; ``seconds`` is how
    long the exchange took from its start to the last one's arrival (measured by a watcher
    thread when started with ``watch``, else by ``wait``; None before); ``waited`` how long
    ``wait`` blocked; ``arrived()`` whether they are in, without waiting (needs ``watch``)."""

    def __init__(self, outs: list, started: float, *, watch: bool):
        self.outs, self.started = outs, started
        self.seconds: float | None = None
        self.waited = 0.0
        self._watcher = None
        if watch:
            self._watcher = threading.Thread(target=self._watch, name="esync-exchange-watch",
                                             daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        for out in self.outs:
            out.wait_to_read()            # MXNet releases the GIL while it waits
        self.seconds = time.perf_counter() - self.started

    def arrived(self) -> bool:
        return self.seconds is not None

    def wait(self) -> None:
        began = time.perf_counter()
        for out in self.outs:
            out.wait_to_read()
        self.waited = time.perf_counter() - began
        if self._watcher is not None:
            self._watcher.join()
        else:
            self.seconds = time.perf_counter() - self.started


class PendingExchange(ArraysInFlight):
    """An exchange of sums and the control vector under way; ``wait()`` also decodes the
    control sum (the last array)."""

    def __init__(self, algorithm: Algorithm, outs: list, started: float, *, watch: bool):
        super().__init__(outs, started, watch=watch)
        self.algorithm = algorithm

    def wait(self) -> ControlSum:
        super().wait()
        w = self.algorithm.worker
        summed = read_control(self.outs[-1].asnumpy(), w.num_workers)
        self.algorithm.global_samples = summed.samples
        return summed


DUMP_ENV = "ESYNC_DUMP_PUSHES"     # tests only: folder for Algorithm.dump's files


def _numpy(value):
    return value.asnumpy() if isinstance(value, nd.NDArray) else np.asarray(value)


def grads(params: list) -> list:
    return [p.grad(p.list_ctx()[0]) for p in params]


def datas(params: list) -> list:
    return [p.data(p.list_ctx()[0]) for p in params]
