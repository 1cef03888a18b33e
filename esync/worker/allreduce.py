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

Every rank of one collective must pass tensors on the same kind of device (else Horovod's
controller stops the job with "Mismatched CPU/GPU device selection"), and Gloo reduces CPU
tensors only. So a GPU rank stages its tensors through CPU buffers (``stages_on_cpu``) whenever
the job mixes CPUs and GPUs (the ranks tell each other their device when the channel opens),
whenever Horovod has no NCCL, or when ``ESYNC_ALLREDUCE_STAGING=cpu`` asks for it;
``ESYNC_ALLREDUCE_STAGING=device`` keeps GPU tensors on the GPU where that can work and is
refused where it cannot. The CPU buffers are made once per key and reused every round.
"""
from __future__ import annotations

import os
from typing import Sequence

import mxnet as mx
from mxnet import nd

from esync.common.collectives import INSTALL_HINT, check_environment
from esync.common.errors import UsageError
from esync.worker.kvstore import Channel, _nbytes

STAGING_ENV = "ESYNC_ALLREDUCE_STAGING"     # auto (the default) | cpu | device
STAGINGS = ("auto", "cpu", "device")


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


def stages_on_cpu(device: str, job_devices, *, nccl: bool, asked: str = "auto") -> bool:
    """Whether a rank on `device` ("cpu" or "gpu") passes its tensors to Horovod through CPU
    buffers, given the device kinds of every rank (`job_devices`), whether Horovod was built
    with NCCL, and what ``ESYNC_ALLREDUCE_STAGING`` asks (auto, cpu, device). Every rank of a
    job decides alike, so all of them hand Horovod CPU tensors, or all GPU tensors; a
    combination that cannot work raises UsageError saying why."""
    if asked not in STAGINGS:
        raise UsageError(f"{STAGING_ENV}={asked!r}: use one of {', '.join(STAGINGS)}")
    mixed = len(set(job_devices)) > 1
    if asked == "device":
        if mixed:
            raise UsageError(f"{STAGING_ENV}=device: this job mixes CPU and GPU workers, and "
                             "every rank of a Horovod collective must pass tensors on the same "
                             "kind of device; leave it at auto (GPU ranks stage to the CPU)")
        if "gpu" in set(job_devices) and not nccl:
            raise UsageError(f"{STAGING_ENV}=device: this Horovod has no NCCL, and Gloo reduces "
                             "CPU tensors only; leave it at auto, or build Horovod with "
                             "HOROVOD_GPU_OPERATIONS=NCCL")
    if device != "gpu":
        return False
    return asked == "cpu" or mixed or not nccl


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
        self._buffers: dict[tuple, nd.NDArray] = {}    # a key's CPU buffer, made once
        self.staging = stages_on_cpu(ctx.device_type, self._device_kinds(ctx),
                                     nccl=bool(self.hvd.nccl_built()),
                                     asked=os.environ.get(STAGING_ENV, "auto"))

    def _device_kinds(self, ctx: mx.Context) -> list[str]:
        """Every rank's device kind, gathered once (on CPU arrays, which any build moves)."""
        mine = nd.array([1 if ctx.device_type == "gpu" else 0], ctx=mx.cpu(), dtype="int32")
        kinds = self.hvd.allgather(mine, name="esync.device_kinds").asnumpy()
        return ["gpu" if k else "cpu" for k in kinds]

    def _staged(self, key: int, array: nd.NDArray) -> nd.NDArray:
        """The array Horovod works on for `key`: `array` itself, or (staging) its CPU buffer
        holding a copy of it."""
        if not self.staging:
            return array
        slot = (key, array.shape, array.dtype)
        if slot not in self._buffers:
            self._buffers[slot] = nd.zeros(array.shape, ctx=mx.cpu(), dtype=array.dtype)
        buffer = self._buffers[slot]
        array.copyto(buffer)
        return buffer

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
            target = self._staged(key, out)
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
        staged = [self._staged(key, value) for key, value in zip(keys, values)]
        self.hvd.grouped_allreduce_(staged, op=self.hvd.Sum,
                                    name="esync.sum." + ".".join(map(str, keys)))
        for total, out in zip(staged, outs):
            if total is not out:
                total.copyto(out)
        self.bytes_pushed += self._ring_bytes(values)
        self.bytes_pulled += self._ring_bytes(outs)
