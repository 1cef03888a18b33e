"""The ring-allreduce collective (``--collective allreduce``): Horovod over Gloo, no server.

Every worker holds the whole model, and a round's sums travel around a ring of the workers: each
link carries about 2(N-1)/N x the arrays each way, in parallel, where the parameter server's one
link carries N x the arrays out (every worker's pull). The algorithms see the same ``Channel`` as
over the parameter server: ``init`` + ``pull`` hand rank 0's values to everyone (a broadcast),
``start_push_pull`` leaves the sum over the workers in ``outs`` (an allreduce of ``values``, in
place, then a copy).

Horovod learns its rank, size and rendezvous from the environment that ``horovodrun --gloo`` or
``esync-cluster --collective allreduce`` sets (``HOROVOD_RANK``, ``HOROVOD_SIZE``,
``HOROVOD_GLOO_RENDEZVOUS_ADDR`` ...; see ``esync.launch.rendezvous``).
"""
from __future__ import annotations

import os
from typing import Sequence

import mxnet as mx
from mxnet import nd

from esync.common.errors import UsageError
from esync.worker.kvstore import Channel, _nbytes

# What Horovod's Gloo controller needs from whoever starts the worker (horovodrun sets them all).
REQUIRED_ENV = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                "HOROVOD_GLOO_RENDEZVOUS_PORT")
INSTALL_HINT = ("install it with `bash scripts/setup.sh` (it builds horovod==0.28.1 with MXNet "
                "and Gloo; needs cmake and g++: `apt-get install cmake g++`)")


def import_horovod():
    """``horovod.mxnet``, or a UsageError that says how to get it."""
    try:
        import horovod.mxnet as hvd
    except ImportError as exc:
        raise UsageError(f"--collective allreduce needs Horovod with MXNet support ({exc}); "
                         f"{INSTALL_HINT}") from None
    if not hvd.gloo_built():
        raise UsageError("--collective allreduce runs on Horovod's Gloo controller, but this "
                         f"Horovod was built without Gloo; {INSTALL_HINT}")
    return hvd


def horovod_missing() -> str | None:
    """Why ``--collective allreduce`` cannot run here (one phrase), or None; no MXNet import."""
    import importlib.util
    if importlib.util.find_spec("horovod") is None:
        return f"Horovod is not installed; {INSTALL_HINT}"
    return None


def check_environment(env=os.environ) -> None:
    """A worker started by hand without Horovod's variables gets told how to start it."""
    missing = [name for name in REQUIRED_ENV if not env.get(name)]
    if missing:
        raise UsageError(f"--collective allreduce: {', '.join(missing)} not set; start the "
                         "workers with `horovodrun --gloo -np N -H host:slots python main.py "
                         "... --collective allreduce`, or run the whole cluster with "
                         "`esync-cluster --collective allreduce` (see README)")


class AllreduceChannel(Channel):
    """Horovod's allreduce and broadcast behind the algorithms' ``Channel``.

    Byte counters count what this worker sends and receives on its link: a ring allreduce
    moves 2(N-1)/N x the arrays each way (reduce-scatter, then allgather); a broadcast's
    receivers get the arrays once.
    """

    name = "allreduce"

    def __init__(self, ctx: mx.Context):
        super().__init__()
        check_environment()
        self.hvd = import_horovod()
        self.hvd.init()
        Channel.joined_job = True          # a failed worker leaves at once (leave_job_at_once)
        self._stored: dict[int, nd.NDArray] = {}
        # A Horovod built without NCCL reduces CPU arrays only: GPU arrays go through a CPU copy.
        self.staging = ctx.device_type == "gpu" and not self.hvd.nccl_built()

    @property
    def rank(self) -> int:
        return self.hvd.rank()

    @property
    def num_workers(self) -> int:
        return self.hvd.size()

    def _ring_bytes(self, arrays) -> int:
        n = self.num_workers
        return int(sum(_nbytes(a) for a in arrays) * 2 * (n - 1) / n)

    def init(self, keys: Sequence[int], values: Sequence[nd.NDArray]) -> None:
        """Rank 0's values become the keys' values (as the parameter server keeps rank 0's)."""
        if self.rank == 0:
            self._stored = {key: value.copy() for key, value in zip(keys, values)}

    def pull(self, keys: Sequence[int], outs: Sequence[nd.NDArray]) -> None:
        for key, out in zip(keys, outs):
            if self.rank == 0 and key in self._stored:
                self._stored[key].copyto(out)
            target = out.as_in_context(mx.cpu()) if self.staging else out
            self.hvd.broadcast_(target, root_rank=0, name=f"esync.pull.{key}")
            if target is not out:
                target.copyto(out)
        nd.waitall()
        if self.rank != 0:
            self.bytes_pulled += sum(_nbytes(a) for a in outs)

    def start_push_pull(self, keys: Sequence[int], values: Sequence[nd.NDArray],
                        outs: Sequence[nd.NDArray]) -> None:
        """One grouped allreduce of `values` (summed in place), copied into `outs`; MXNet's
        engine runs it in the background, so this returns at once."""
        staged = [v.as_in_context(mx.cpu()) for v in values] if self.staging else list(values)
        self.hvd.grouped_allreduce_(staged, op=self.hvd.Sum,
                                    name="esync.sum." + ".".join(map(str, keys)))
        for total, out in zip(staged, outs):
            if total is not out:
                total.copyto(out)
        self.bytes_pushed += self._ring_bytes(values)
        self.bytes_pulled += self._ring_bytes(outs)
