"""Speed schedules: emulated devices whose speed changes during a run.

``--speed-schedule cpu1:1@0,6@30;cpu2:2@10``: device ``cpu1`` runs at x1 from 0 s and x6 from
30 s of training, ``cpu2`` at x2 from 10 s (before its first change a device keeps its
``--slowdown``). The launcher changes a CPU-capped device's quota when its factor changes; a
worker emulating by sleeping changes its own factor; both log the factor in force. Plain Python,
shared by the worker and the launcher.
"""
from __future__ import annotations

import bisect
import contextlib
import math
import os
import re
import sys
import threading
import time

from esync.common.errors import UsageError

DEVICE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# Set by a launcher that caps this worker's CPU: the cgroup (a folder) it joins to train.
CPU_CGROUP_ENV = "ESYNC_CPU_CGROUP"
# Set with it unless the launcher was told not to pin: the CPU the capped threads run on
# (``esync.launch.cgroups.place_on_cpus``).
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


class ScheduleError(UsageError, ValueError):
    """A speed schedule that does not parse; the message names the token and the format."""


SCHEDULE_FORMAT = ("DEVICE:FACTOR@SECONDS[,FACTOR@SECONDS...][;DEVICE:...], "
                   "e.g. cpu1:1@0,6@30;cpu2:2@10")


def _number(token: str, what: str, entry: str) -> float:
    try:
        value = float(token)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ScheduleError(f"speed schedule: {what} {token!r} in {entry!r} is not a number; "
                            f"expected {SCHEDULE_FORMAT}")
    return value


def parse_speed_schedule(text: str, devices=None) -> dict[str, list[tuple[float, float]]]:
    """``"cpu1:1@0,6@30;cpu2:2@10"`` -> ``{"cpu1": [(0.0, 1.0), (30.0, 6.0)], "cpu2":
    [(10.0, 2.0)]}``: for each device, (seconds since the start, slow-down factor) by time.

    A factor is how many times slower than a x1 device (>= 1); seconds are >= 0. With
    ``devices`` given, a device not among them is an error too. ScheduleError (a ValueError
    and a UsageError) names the bad token and shows the expected format.
    """
    known = None if devices is None else list(devices)
    schedule: dict[str, list[tuple[float, float]]] = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        device, colon, points = (s.strip() for s in entry.partition(":"))
        if not colon or not device or not points:
            raise ScheduleError(f"speed schedule: {entry!r} is not DEVICE:FACTOR@SECONDS,...; "
                                f"expected {SCHEDULE_FORMAT}")
        if not DEVICE_RE.match(device):
            raise ScheduleError(f"speed schedule: {device!r} in {entry!r} is not a device name "
                                "(letters, digits, '_' and '-')")
        if known is not None and device not in known:
            raise ScheduleError(f"speed schedule: no device {device!r} in this run; devices: "
                                f"{', '.join(known)}")
        if device in schedule:
            raise ScheduleError(f"speed schedule: device {device!r} appears twice; give all "
                                f"its changes in one entry, e.g. {device}:1@0,4@30")
        changes = {}
        for point in (p.strip() for p in points.split(",")):
            factor, at, seconds = (s.strip() for s in point.partition("@"))
            if not at or not factor or not seconds:
                raise ScheduleError(f"speed schedule: {point!r} in {entry!r} is not "
                                    f"FACTOR@SECONDS; expected {SCHEDULE_FORMAT}")
            f = _number(factor, "factor", entry)
            t = _number(seconds, "time", entry)
            if f < 1:
                raise ScheduleError(f"speed schedule: factor {factor!r} in {entry!r} must be "
                                    ">= 1 (how many times slower than a x1 device)")
            if t < 0:
                raise ScheduleError(f"speed schedule: time {seconds!r} in {entry!r} must be "
                                    ">= 0 seconds since the start")
            if t in changes:
                raise ScheduleError(f"speed schedule: two factors at {seconds} s in {entry!r}")
            changes[t] = f
        schedule[device] = sorted(changes.items())
    if not schedule:
        raise ScheduleError(f"speed schedule {text!r} is empty; expected {SCHEDULE_FORMAT}")
    return schedule


def factor_in_force(changes: list[tuple[float, float]], elapsed: float,
                    initial: float = 1.0) -> float:
    """The factor of one device's ``changes`` (sorted (seconds, factor)) ``elapsed`` seconds
    after the start: the latest change at or before then, ``initial`` before the first."""
    i = bisect.bisect_right([t for t, _ in changes], elapsed)
    return changes[i - 1][1] if i else initial


def next_change(changes: list[tuple[float, float]], elapsed: float) -> float | None:
    """When (seconds since the start) the next change after ``elapsed`` happens; None: none."""
    i = bisect.bisect_right([t for t, _ in changes], elapsed)
    return changes[i][0] if i < len(changes) else None
