"""An emulated device's speed, the worker's side: joining the CPU cap its launcher made for it.

A launcher that caps a worker's CPU (``esync.emulation.cgroups``) names the worker's cgroup and
CPU in its environment (``CPU_CGROUP_ENV``, ``CPU_PIN_ENV``); the worker joins the cap when its
training starts (``join_cpu_cap``), leaves its communication threads outside it
(``communication_threads``) and leaves it when training ends (``leave_cpu_cap``). Plain Python,
shared by the worker and the launcher (which reads the variables' names).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from esync.common.errors import UsageError

# Set by a launcher that caps this worker's CPU: the cgroup (a folder) it joins to train.
CPU_CGROUP_ENV = "ESYNC_CPU_CGROUP"
# Set with it unless the launcher was told not to pin: the CPU the capped threads run on
# (``esync.emulation.cgroups.place_on_cpus``).
CPU_PIN_ENV = "ESYNC_CPU_PIN"


# Threads that carry this worker's communication (ps-lite's and ZeroMQ's, Horovod's background
# loop, MXNet's engine threads for the host's context, where the KVStore's push and pull run),
# recorded by ``communication_threads`` when they start.
_COMMUNICATION_THREADS: set[int] = set()
# The thread that called ``join_cpu_cap`` and stays out of the cap: the training loop's Python,
# which dispatches the device's operators.
_TRAINING_THREADS: set[int] = set()

# What ``join_cpu_cap`` put under the cap.
OPERATOR_THREADS = "MXNet's operator threads"
EVERY_THREAD = "every thread"


def thread_ids() -> set[int]:
    """This process's threads now (Linux task ids); empty where /proc is missing."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()


@contextlib.contextmanager
def communication_threads():
    """Record the threads started inside the block as communication: ``join_cpu_cap`` leaves
    them out of the device's cap. An emulated device is slow at computing; its network stack
    runs on its host, as a real GPU's does (see ``join_cpu_cap``)."""
    before = thread_ids()
    try:
        yield
    finally:
        _COMMUNICATION_THREADS.update(thread_ids() - before)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _thread_cpu_seconds(tid: int) -> float:
    """CPU seconds (user + system) of one of this process's threads; 0 once it has ended."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS     # utime, stime
    except (OSError, ValueError, IndexError):
        return 0.0


def cpu_seconds_under_cap() -> float:
    """This process's CPU seconds, less those of the threads ``join_cpu_cap`` leaves out of the
    cap (communication, the training thread's Python): what the device's cap rations. Round logs
    record it, so that a capped device's compute rate can be read against its cap; the threads
    outside it would make a slow device look faster than its factor. (A thread outside that has
    ended stops being subtracted; none ends before the worker does.)"""
    outside = _COMMUNICATION_THREADS | _TRAINING_THREADS
    return time.process_time() - sum(_thread_cpu_seconds(t) for t in outside)


def _thread_cpu_ns(tid: int) -> int:
    """Nanoseconds one of this process's threads has run (the scheduler's own account,
    ``/proc/self/task/<tid>/schedstat``; the 10 ms ticks of its ``stat`` where that is
    missing); 0 once it has ended."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as stat:
            return int(stat.read().split()[0])
    except (OSError, ValueError, IndexError):
        return round(_thread_cpu_seconds(tid) * 1e9)


def capped_cpu_seconds(group: str) -> float:
    """CPU seconds of this process's threads in the cap's ``group`` (those ``join_cpu_cap`` put
    there and those they started since: MXNet's engine workers), to the nanosecond where the
    kernel keeps it: a warm-up probe runs for a few milliseconds of CPU (``cap_seconds``).
    Where the whole process joined (no per-thread ``tasks``), the process's."""
    try:
        with open(os.path.join(group, "tasks")) as tasks:
            inside = {int(t) for t in tasks.read().split()} & thread_ids()
    except (OSError, ValueError):
        return time.process_time()
    return sum(_thread_cpu_ns(t) for t in inside) / 1e9


def cap_cores(group: str) -> float | None:
    """The cores a cap's group gives per second, read back from the kernel (cgroup v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, v2's ``cpu.max``); None: no limit."""
    try:
        if os.path.exists(os.path.join(group, "cpu.max")):
            with open(os.path.join(group, "cpu.max")) as f:
                quota, period = f.read().split()
        else:
            with open(os.path.join(group, "cpu.cfs_quota_us")) as f:
                quota = f.read().strip()
            with open(os.path.join(group, "cpu.cfs_period_us")) as f:
                period = f.read().strip()
    except (OSError, ValueError):
        return None
    return cores_from(quota, period)


def cores_from(quota: str, period: str) -> float | None:
    """A cap's cores from the kernel's quota and period as its files spell them ("max" in
    cgroup v2, "-1" in v1: no limit)."""
    return None if quota in ("max", "-1") else int(quota) / int(period)


def cap_seconds(cpu_seconds: float, cores: float) -> float:
    """How long ``cpu_seconds`` of compute last under a cap of ``cores`` once its quota is
    spent: the device's steady speed. Short work's wall time says little of it: CFS lets a
    burst of a few milliseconds run at full speed while the period's quota lasts (a x1
    device's 1/8-batch probe under 3 ms per 10 ms read three times too fast), and rounds a
    very small cap's work up to whole periods (a x16 device's, 1 ms per 53 ms, up to twice too
    slow), so two probes' wall times were no measure of two devices' speeds."""
    return cpu_seconds / cores


def join_cpu_cap(environ=os.environ) -> tuple[str, str] | None:
    """Put this worker's device, MXNet's operator threads, under the CPU cap its launcher made
    for it, if any; return (the group, what it holds: ``OPERATOR_THREADS`` or ``EVERY_THREAD``).

    Called from the training thread when training starts (start-up runs at the machine's speed),
    after the model's initialisation has run operators, so MXNet's engine threads exist. Where
    threads can be placed one by one (cgroup v1's ``tasks``) every thread joins except the caller
    and the communication threads (``communication_threads``), which include the engine threads of
    the host's CPU context: the device trains on its own context, whose engine threads run its
    operators alone. On a real accelerator only the kernels run on the device: the training loop's
    Python (the batch, the dispatch of each operator, the bookkeeping between them), the network
    stack and the KVStore's push and pull run on its host at the host's speed. Capped with the
    device, that Python ran at a x8 device's sixteenth of a core (the device trained 38% fewer
    samples a second for the same operators), and a throttled x8 device could not even read a
    message until its next CFS period (up to 60 ms per hop), which no real device does. Threads the
    caller starts later stay outside with it. Where threads cannot be placed one by one (cgroup v2
    outside threaded mode) the whole process joins. A group that cannot be joined is an error: the
    emulated speed would be wrong."""
    group = environ.get(CPU_CGROUP_ENV)
    if not group:
        return None
    _ORIGIN[:] = [_own_cgroup(group)]
    tasks = os.path.join(group, "tasks")
    per_thread = os.path.exists(tasks)
    if per_thread:
        _TRAINING_THREADS.add(threading.get_native_id())
    device = thread_ids() - _COMMUNICATION_THREADS - _TRAINING_THREADS
    pin_compute_threads(environ.get(CPU_PIN_ENV), device)
    try:
        if per_thread:
            fd = os.open(tasks, os.O_WRONLY)
            try:
                for tid in sorted(device):
                    try:
                        os.write(fd, f"{tid}\n".encode())   # one task id per write
                    except ProcessLookupError:
                        pass                                 # a thread that just ended
            finally:
                os.close(fd)
            return group, OPERATOR_THREADS
        with open(os.path.join(group, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    except OSError as exc:
        raise UsageError(f"cannot join the CPU cap {group} ({exc.strerror or exc}); the launcher "
                         f"that made it must run as root and still be running") from None
    return group, EVERY_THREAD


# The cgroup this process was in before ``join_cpu_cap`` (None: unknown), for ``leave_cpu_cap``.
_ORIGIN: list[str | None] = []


def _own_cgroup(group: str) -> str | None:
    """The folder of this process's cgroup in the hierarchy `group` belongs to, or None.

    The hierarchy's root is `group`'s topmost ancestor holding ``cgroup.procs``; the path under
    it comes from ``/proc/self/cgroup`` (cgroup v2's ``0::`` line, or v1's line naming ``cpu``)."""
    root = None
    folder = os.path.dirname(os.path.abspath(group))
    while os.path.exists(os.path.join(folder, "cgroup.procs")):
        root, folder = folder, os.path.dirname(folder)
        if folder == "/":
            break
    if root is None:
        return None
    v2 = os.path.exists(os.path.join(root, "cgroup.controllers"))
    try:
        with open("/proc/self/cgroup") as lines:
            for line in lines:
                number, controllers, path = line.rstrip("\n").split(":", 2)
                if (number == "0" and not controllers) if v2 else "cpu" in controllers.split(","):
                    return os.path.join(root, path.lstrip("/"))
    except (OSError, ValueError):
        pass
    return None


# The CPUs this process might use before ``pin_compute_threads`` (empty: nothing pinned).
_UNPINNED: list[set[int]] = []


def pin_compute_threads(cpu: str | None, tids) -> None:
    """Keep the threads that join the cap (and the threads they start later: MXNet's engine
    workers) on one CPU, ``cpu`` (the launcher's ``ESYNC_CPU_PIN``; None or "": not pinned).
    Best effort: a CPU this process may not use leaves the threads where they were, with one
    warning line, since the cap alone still gives the device its speed."""
    if not cpu:
        return
    try:
        target = {int(cpu)}
        before = os.sched_getaffinity(0)
        for tid in sorted(tids):
            try:
                os.sched_setaffinity(tid, target)
            except ProcessLookupError:
                pass                                 # a thread that just ended
    except (OSError, ValueError) as exc:
        print(f"warning: cannot pin this device's compute to CPU {cpu!r} ({exc}); it runs "
              "where the scheduler puts it", file=sys.stderr, flush=True)
        return
    _UNPINNED[:] = [before]


def unpin_threads() -> None:
    """Let every thread run on the CPUs the process had before ``pin_compute_threads``."""
    if not _UNPINNED:
        return
    for tid in sorted(thread_ids()):
        try:
            os.sched_setaffinity(tid, _UNPINNED[0])
        except OSError:
            pass


def leave_cpu_cap() -> None:
    """Move this process back to the cgroup it left in ``join_cpu_cap``, once training is over.

    What follows training (the last reports, ps-lite's goodbye, MXNet's shutdown) is not the
    device's work, and under a x8 device's cap it held every run up by 1-3 s. Best effort: a
    group that cannot be left only costs that time."""
    unpin_threads()
    origin = _ORIGIN[0] if _ORIGIN else None
    if origin is None:
        return
    tasks = os.path.join(origin, "tasks")
    try:
        if os.path.exists(tasks):
            fd = os.open(tasks, os.O_WRONLY)
            try:
                for tid in sorted(thread_ids()):
                    try:
                        os.write(fd, f"{tid}\n".encode())
                    except ProcessLookupError:
                        pass
            finally:
                os.close(fd)
        else:
            with open(os.path.join(origin, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
    except OSError:
        pass
