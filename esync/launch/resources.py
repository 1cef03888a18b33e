"""What each process of a job gets of its machine: emulated or real, how many threads, which GPU.

Pure rules, shared by every backend and shown by ``esync-cluster --explain``:

- **Emulated or real** (``emulates_devices``): a run emulates its devices when some device is
  slowed (a factor above 1, now or in ``--speed-schedule``) or ``--emulation cpu-cap`` is given.
  Only then are CPU caps, pinning and one compute thread per worker applied (every device,
  the x1 ones included, so that the factors hold between them). A run of real devices
  (``--devices gpu0,gpu1,cpu`` at slow-down 1) caps nothing.
- **Threads** (``worker_threads``): ``--threads`` when given; else one per worker in an
  emulated run (repeatable speeds, as always), and in a real run a GPU worker keeps
  ``GPU_WORKER_THREADS`` cores (its Python, MXNet's engine and ps-lite threads), the machine
  that holds the scheduler, servers, state server and evaluator keeps
  ``COORDINATION_CORES`` for them, and the CPU workers of a machine share what is left evenly
  (at least one each).
- **GPUs** (``visible_devices``): each GPU worker sees only its own GPU
  (``CUDA_VISIBLE_DEVICES=N``) and trains on it as ``gpu(0)``; every other process sees none
  (``CUDA_VISIBLE_DEVICES=""``). Under a CUDA build of MXNet the KVStore's buffers are pinned
  host memory allocated on GPU 0 (``Comm``'s ``Context::CPUPinned(0)``), so without this every
  process of a machine would hold a CUDA context on GPU 0; with no GPU visible, MXNet
  allocates them as plain host memory instead.
"""
from __future__ import annotations

from collections import Counter

from esync.common.errors import UsageError

GPU_WORKER_THREADS = 2    # a GPU worker's host threads: Python and data, the engine, ps-lite
COORDINATION_CORES = 1    # scheduler, server(s), state server and evaluator, together
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
NO_GPU = ""               # CUDA_VISIBLE_DEVICES of every process that is not a GPU worker


def emulates_devices(slowdowns, *, emulation: str = "auto",
                     schedule_factors=()) -> bool:
    """Whether the run emulates slow devices (then, and only then, caps and pinning apply)."""
    return emulation == "cpu-cap" or any(f > 1 for f in [*slowdowns, *schedule_factors])


def gpu_index(device: str) -> int | None:
    """N of ``gpuN`` (or of ``gpuN-M``, the M-th worker sharing GPU N); None for a CPU."""
    if not device.startswith("gpu"):
        return None
    return int(device[3:].split("-")[0])


def visible_devices(device: str) -> str:
    """``CUDA_VISIBLE_DEVICES`` of a worker on `device` (every other role: ``NO_GPU``)."""
    index = gpu_index(device)
    return NO_GPU if index is None else str(index)


def worker_threads(devices, machines, cores: dict, *, given: int | None, emulated: bool,
                   coordination_machine=None) -> list[int]:
    """OMP_NUM_THREADS of each worker (see the module's rule).

    ``machines[i]`` names the machine worker i runs on (workers of one machine share its
    cores; emulated hosts of one computer are one machine), ``cores[machine]`` its cores
    (a machine missing there counts one core per worker: nothing is divided), and
    ``coordination_machine`` the one running the coordination roles.
    """
    if given is not None:
        return [given] * len(devices)
    if emulated:
        return [1] * len(devices)
    gpus = Counter(m for d, m in zip(devices, machines) if gpu_index(d) is not None)
    cpus = Counter(m for d, m in zip(devices, machines) if gpu_index(d) is None)
    threads = []
    for device, machine in zip(devices, machines):
        if gpu_index(device) is not None:
            threads.append(GPU_WORKER_THREADS)
            continue
        reserved = gpus[machine] * GPU_WORKER_THREADS
        reserved += COORDINATION_CORES if machine == coordination_machine else 0
        left = cores.get(machine, reserved + cpus[machine]) - reserved
        threads.append(max(1, left // cpus[machine]))
    return threads


def within(visible: str, inherited: str | None) -> str:
    """A role's ``CUDA_VISIBLE_DEVICES`` when what starts it already restricts the GPUs to
    `inherited` (a user's ``CUDA_VISIBLE_DEVICES=2,3``, a Slurm allocation): the plan's index
    N means the N-th GPU of that list. Unrestricted (None or unset), the plan's value stands;
    an index beyond the list is a UsageError that names both.
    """
    if not visible or inherited is None:
        return visible
    allowed = [g.strip() for g in inherited.split(",") if g.strip()]
    index = int(visible)
    if index >= len(allowed):
        raise UsageError(f"gpu{index} asked for, but only {len(allowed)} GPU(s) are visible "
                         f"here (CUDA_VISIBLE_DEVICES={inherited})")
    return allowed[index]
