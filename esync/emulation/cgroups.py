"""Slow devices emulated by CPU caps: one cgroup per emulated device, with a CPU quota.

Why. A worker emulating a device F times slower used to sleep (F-1) times its compute time after
each step. Its compute still ran at full speed, competing with every other worker for the
machine's cores, so how slow a "fast" worker really was depended on what the others happened to
be doing. Mininet's CPULimitedHost does it the other way round, and so does this module: each
emulated device's worker runs in a cgroup whose CFS bandwidth quota lets it use at most
``share / F`` of one core, whatever the others do. With one compute thread per worker (see
``ONE_COMPUTE_THREAD_ENV``) the worker then computes F times slower than a ``x1`` device, and
the quotas add up to a known budget that the machine can actually give.

How.

    caps = CpuCaps()                              # CgroupsUnavailable: fall back to sleeping
    share = default_share([1, 1, 4, 8], cores=os.cpu_count())
    for device, factor in ...:
        caps.cap(device, share / factor)          # a fraction of one core; also live changes
        subprocess.Popen(caps.exec_prefix(device) + argv, env=env | ONE_COMPUTE_THREAD_ENV)
    ...
    caps.close()                                  # or `with CpuCaps() as caps:`

Layout. The groups live at the top of the hierarchy that holds the ``cpu`` controller, which
``find_cpu_controller`` finds in /proc/self/mountinfo (nothing is hard-coded):

    <root>/esync-<pid>.<start>.<n>/<device>     e.g. /sys/fs/cgroup/cpu/esync-4242.913377.0/cpu2

``<pid>`` and ``<start>`` (its start time in clock ticks since boot, as in /proc/<pid>/stat) name
the launcher that made the group, so that a later run tells a dead owner from a live one even
when the pid was reused, and ``<n>`` numbers the ``CpuCaps`` of one process. A launcher killed
by SIGKILL cannot clean up; ``remove_stale()`` (called by every new ``CpuCaps``, or
``python -m esync.emulation.cgroups clean``) removes the groups of owners that are gone, moving any
process still inside back to the root group first, and never touches a live owner's groups.

Both cgroup versions work:

* v2 (unified hierarchy): the group's ``cpu.max`` gets ``"<quota> <period>"`` in microseconds.
  The ``cpu`` controller must be listed in the root's ``cgroup.controllers``; it is enabled in
  the root's and in our parent group's ``cgroup.subtree_control`` when it is not yet. A machine
  whose v2 root has no ``cpu`` (a hybrid set-up whose ``cpu`` is bound to v1) uses v1.
* v1: the hierarchy mounted with the ``cpu`` option (``/sys/fs/cgroup/cpu`` or
  ``/sys/fs/cgroup/cpu,cpuacct`` on most systems); ``cpu.cfs_period_us`` and
  ``cpu.cfs_quota_us``.

A quota is a fraction of one core per period: 0.45 core is 4500 us per 10000 us. The kernel
refuses quotas under 1 ms, and a quota under one CFS bandwidth slice (a global kernel setting,
5 ms by default) throttles unevenly, so a small cap uses a longer period (up to the kernel's
1 s, that is down to 0.001 core). The caps of a launcher lower the slice to 1 ms while their
groups exist (``CfsSlice``; the last launcher to close, or the first run after a SIGKILLed one,
puts the kernel's value back): a 0.079-core x8 device then runs 1 ms per 12.7 ms instead of
5 ms per 63 ms, so its iterations no longer last two periods or three at random. A cap above
1 core is allowed (several threads may run at once) but a worker with one compute thread cannot
use it.

Creating groups and moving processes needs write access to the hierarchy: root, or a delegated
v2 subtree. Where that is missing, ``find_cpu_controller`` returns a one-line reason instead of a
controller and ``CpuCaps()`` raises ``CgroupsUnavailable`` with that line, so the launcher prints
one warning and emulates by sleeping as before.

The quota counts the device's work: MXNet's operator threads for the worker's CPU context. The
training loop's Python (the batch, the dispatch of each operator, the bookkeeping), the KVStore's
push and pull (the engine threads of CPU context 0) and the communication threads (ps-lite's and
ZeroMQ's, Horovod's background loop) stay outside where threads can be placed one by one
(v1's ``tasks``; ``esync.common.speeds.join_cpu_cap``): an emulated device is a slow
accelerator, whose host and network card run at full speed. Capped with the rest, a throttled
x8 device could not even receive a message until its next CFS period (up to 60 ms per hop), an
exchange overlapped with its computing stalled, and its Python ran at a sixteenth of a core. On
cgroup v2 the whole process is capped, and the worker's log says which. The parameter server,
scheduler, evaluator and state server stay uncapped; ``default_share`` keeps ``reserve`` of a
core free for them (and the threads outside the caps) so that the workers' quotas can always be
met.

Speed schedules (``esync.common.speeds``: a device that changes speed during the run): the
launcher calls ``cap`` again when a factor changes.
"""
from __future__ import annotations

import argparse
import errno
import itertools
import math
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from esync.common import runlayout
from esync.common.errors import UsageError
from esync.common.procs import process_start_time
from esync.common.speeds import cores_from
from esync.emulation.schedules import DEVICE_RE     # also never a cgroup file's name

PREFIX = "esync"
GROUP_RE = re.compile(rf"^{PREFIX}-(\d+)\.(\d+)\.(\d+)$")        # esync-<pid>.<start>.<n>

PERIOD_US = 10_000               # a tenth of the kernel's default: see quota_for
MIN_QUOTA_US = 1_000             # the kernel refuses shorter quotas (v1 and v2)
# The kernel hands quota to a CPU in slices of sched_cfs_bandwidth_slice_us (5 ms by default); a
# quota below one slice throttles unevenly (measured here: a 0.1-core cap at 1 ms per 10 ms ran
# 20% slower than 1/4 of a 0.4-core cap), so small caps get a longer period instead: at least
# one slice per period. With the kernel's slice a x8 device of the default cluster (0.079 core)
# ran 5 ms per 63 ms period, so one iteration took either two periods or three (125 or 180 ms):
# a jitter no device has, which the round rule must predict. ``CfsSlice`` lowers the slice to
# FINE_SLICE_US while a launcher's groups exist, and the periods shrink with it (12.7 ms).
MIN_RUN_US = 5_000               # the kernel's default slice
FINE_SLICE_US = MIN_QUOTA_US     # the slice while caps run: the smallest quota is one slice
SLICE_FILE = Path("/proc/sys/kernel/sched_cfs_bandwidth_slice_us")
SAVED_SLICE_FILE = Path("/run/esync-cfs-bandwidth-slice-us")   # the slice before we lowered it
MAX_PERIOD_US = 1_000_000        # ... and longer periods
MIN_CORES = MIN_QUOTA_US / MAX_PERIOD_US

# CPU left to the processes that are not workers: the parameter server (it sums every push and
# answers every pull), the ps-lite scheduler (idle after the rendezvous), the evaluator (runs a
# test pass every few seconds) and the state server (small HTTP requests), and the workers'
# threads outside their caps (ps-lite's, ZeroMQ's, the training loop's Python that dispatches
# the operators). Measured side by side on 2 cores with the default 1, 1, 4, 8 (docs/results/emulation.md;
# the side-by-side reports are in git history): with half a core left (a x1 device at 0.63) a x1 device trained at 0.82 of
# the same device alone, with 0.81 left (0.5) at 0.90, with 1.05 left (0.4) at 0.87. The quotas
# are caps, not reservations: whatever the others leave unused is simply idle.
DEFAULT_RESERVE = 0.8

# How much a launcher's groups weigh against an ordinary process when they want CPU at the same
# moment (cpu.shares in v1, where an ordinary process is 1024; cpu.weight in v2, where it is
# 100). Caps alone are ceilings: on a busy machine CFS would still share a core fairly among
# everybody, and a x1 worker capped at 0.63 core could get 0.3. Weighing 100 ordinary processes,
# a worker gets its cap first; since default_share leaves `reserve` cores uncapped, the rest of
# the job (and whatever else runs) still has that much.
DEFAULT_WEIGHT = 100.0

# Environment for a worker whose CPU is capped: one compute thread, so that a quota of c cores
# makes it c times as fast as one free core (several threads would burn the quota in a burst and
# then all stall until the next period). Names from MXNet 1.9.1's documented variables
# (docs/faq/env_var.md) and from the OpenBLAS that its wheel bundles.
ONE_COMPUTE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",              # OpenMP threads per operator (also MKL-DNN's)
    "OPENBLAS_NUM_THREADS": "1",         # the bundled OpenBLAS's own thread pool
    "MXNET_CPU_WORKER_NTHREADS": "1",    # operators the engine runs at once on the CPU
    "MXNET_CPU_PRIORITY_NTHREADS": "1",  # threads for prioritised CPU jobs (default 4)
    "MXNET_USE_OPERATOR_TUNING": "0",    # no timing of operators at import: it would run
                                         # under the cap and only choose OpenMP or not, moot
                                         # with one OpenMP thread
}

_instances = itertools.count()
_SH_JOIN = 'echo $$ > "$1" && shift && exec "$@"'


class CgroupError(OSError):
    """Creating, capping or removing a group failed; the message says which file said what, and
    ``errno`` is the kernel's (ESRCH: the process has exited, EBUSY: the group still has tasks).
    """

    def __init__(self, code: int | None, message: str):
        super().__init__(message)
        self.errno = code


class CgroupsUnavailable(UsageError):
    """This machine offers no usable cgroup cpu controller (not mounted, no permission, ...)."""


# --- finding the controller ---------------------------------------------------------------------

@dataclass(frozen=True)
class CpuController:
    """The hierarchy that holds the cpu controller: ``version`` 1 or 2, mounted at ``root``."""
    version: int
    root: Path

    def describe(self) -> str:
        files = "cpu.max" if self.version == 2 else "cpu.cfs_quota_us / cpu.cfs_period_us"
        return f"cgroup v{self.version} cpu controller at {self.root} ({files})"


@dataclass(frozen=True)
class _Mount:
    root: str               # the mounted subtree of the hierarchy
    point: Path
    fstype: str
    options: frozenset      # per-mount options (rw, ro, ...)
    super_options: frozenset  # per-superblock options (for v1 cgroups, the controllers)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _cgroup_mounts(mountinfo: str) -> list[_Mount]:
    mounts = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 6 or len(fields) < dash + 4:
            continue
        fstype = fields[dash + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append(_Mount(_unescape(fields[3]), Path(_unescape(fields[4])), fstype,
                             frozenset(fields[5].split(",")),
                             frozenset(fields[dash + 3].split(","))))
    # a bind mount of a subtree is a poorer choice than the hierarchy's root
    return sorted(mounts, key=lambda m: m.root != "/")


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _writable(mount: _Mount) -> str | None:
    """None, or why we cannot create groups there."""
    if "ro" in mount.options:
        return f"{mount.point} is mounted read-only"
    if not os.access(mount.point, os.W_OK):
        who = "root" if os.geteuid() != 0 else "write access"
        return f"creating groups in {mount.point} needs {who}"
    return None


def _enable_cpu(group: Path) -> str | None:
    """v2: make sure the children of ``group`` get the cpu controller; None, or why not."""
    control = group / "cgroup.subtree_control"
    if "cpu" in _words(control):
        return None
    try:
        control.write_text("+cpu")
    except OSError as exc:
        return f"cannot enable the cpu controller in {control}: {exc.strerror or exc}"
    return None


def find_cpu_controller(mountinfo: str | None = None) -> CpuController | str:
    """The usable cpu controller, or one line saying why there is none.

    ``mountinfo`` is the text of /proc/self/mountinfo (read when None). cgroup v2 wins when its
    root offers ``cpu`` (which is then enabled for children if needed); otherwise the v1
    hierarchy mounted with ``cpu``. A returned string is meant for a warning line, e.g.
    ``f"warning: no CPU caps ({why}); slow devices sleep instead"``.
    """
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError as exc:
            return f"cannot read /proc/self/mountinfo: {exc.strerror or exc}"
    mounts = _cgroup_mounts(mountinfo)
    reasons = []
    for mount in (m for m in mounts if m.fstype == "cgroup2"):
        if "cpu" not in _words(mount.point / "cgroup.controllers"):
            continue            # hybrid set-up: cpu is bound to a v1 hierarchy
        why = _writable(mount) or _enable_cpu(mount.point)
        if why is None:
            return CpuController(2, mount.point)
        reasons.append(why)
    for mount in (m for m in mounts if m.fstype == "cgroup" and "cpu" in m.super_options):
        if not (mount.point / "cpu.cfs_quota_us").exists():
            reasons.append(f"{mount.point} has no cpu.cfs_quota_us (kernel without "
                           "CONFIG_CFS_BANDWIDTH)")
            continue
        why = _writable(mount)
        if why is None:
            return CpuController(1, mount.point)
        reasons.append(why)
    if reasons:
        return "; ".join(dict.fromkeys(reasons))
    return "no cgroup cpu controller is mounted (none in /proc/self/mountinfo)"


def _controller(controller: CpuController | None) -> CpuController:
    if controller is not None:
        return controller
    found = find_cpu_controller()
    if isinstance(found, str):
        raise CgroupsUnavailable(f"CPU caps unavailable: {found}")
    return found


# --- owners ---------------------------------------------------------------------------------------

def _owner_alive(pid: int, start: int) -> bool:
    return process_start_time(pid) == start


# --- quotas ---------------------------------------------------------------------------------------

def quota_for(cores: float | None, min_run_us: int = MIN_RUN_US) -> tuple[int | None, int]:
    """``(quota_us, period_us)`` giving ``cores`` of CPU time per period; None: no cap.

    A period of 10 ms (the kernel's default is 100 ms) unless the quota would fall under
    ``min_run_us`` (the kernel's CFS bandwidth slice in force), when the period grows (to at
    most 1 s). Short periods make a capped worker slow at every moment, as a slow device is:
    with 100 ms, a x1 worker that idled at the round's barrier ran its next iterations at full
    speed until its quota ran out. ValueError for a cap that is not a positive number or under
    0.001 core.
    """
    if cores is None:
        return None, PERIOD_US
    if not isinstance(cores, (int, float)) or not math.isfinite(cores) or cores <= 0:
        raise ValueError(f"a CPU cap is a positive number of cores, not {cores!r}")
    if cores < MIN_CORES * (1 - 1e-9):
        raise ValueError(f"a CPU cap of {cores:g} core is below the kernel's smallest, "
                         f"{MIN_CORES:g} core (1 ms per 1 s)")
    period = PERIOD_US
    min_run_us = max(MIN_QUOTA_US, min_run_us)
    if cores * period < min_run_us:
        period = min(MAX_PERIOD_US, math.ceil(min_run_us / cores))
    return max(MIN_QUOTA_US, round(cores * period)), period


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise CgroupError(exc.errno, f"writing {text.strip()!r} to {path}: "
                                     f"{exc.strerror or exc}") from exc


def _procs(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def _evacuate(group: Path, root: Path, timeout: float = 2.0) -> None:
    """Move every process of ``group`` (and of its children) to the root group."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            groups = [group] + [p for p in group.iterdir() if p.is_dir()]
        except FileNotFoundError:
            return                                   # removed meanwhile (another cleaner)
        pids = [pid for g in groups for pid in _procs(g)]
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                (root / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                if exc.errno != errno.ESRCH:         # gone meanwhile: fine
                    raise CgroupError(exc.errno, f"moving pid {pid} out of {group}: "
                                                 f"{exc.strerror or exc}") from exc


def _rmdir(group: Path, timeout: float = 2.0) -> None:
    """Remove an empty group, retrying while the kernel still counts exiting tasks in it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise CgroupError(exc.errno, f"removing {group}: {exc.strerror or exc}") from exc
            time.sleep(0.05)


def _remove_tree(group: Path, root: Path) -> None:
    """Move the tasks out of ``group`` and its children, then remove them, children first."""
    _evacuate(group, root)
    try:
        children = [p for p in group.iterdir() if p.is_dir()]
    except FileNotFoundError:
        return
    for child in children:
        _rmdir(child)
    _rmdir(group)


def remove_stale(controller: CpuController | None = None) -> list[Path]:
    """Remove the groups of launchers that are gone (``esync-<pid>.<start>.<n>`` whose process
    no longer runs, or whose pid now belongs to another process); returns the groups removed.

    A process still inside one (a worker that outlived its SIGKILLed launcher) is moved to the
    root group first. Groups of live owners are never touched. Without a usable controller there
    is nothing to clean: returns [].
    """
    if controller is None:
        found = find_cpu_controller()
        if isinstance(found, str):
            return []
        controller = found
    removed = []
    try:
        entries = sorted(controller.root.iterdir())
    except OSError:
        return []
    for group in entries:
        match = GROUP_RE.match(group.name)
        if not match or not group.is_dir() or _owner_alive(int(match[1]), int(match[2])):
            continue
        try:
            _remove_tree(group, controller.root)
        except CgroupError:
            continue            # busy or raced with another cleaner: next run tries again
        removed.append(group)
    return removed


def _groups_exist(root: Path) -> bool:
    """Whether any launcher's groups (live or stale) are in ``root``."""
    try:
        return any(GROUP_RE.match(entry.name) and entry.is_dir() for entry in root.iterdir())
    except OSError:
        return False


@dataclass(frozen=True)
class CfsSlice:
    """The kernel's CFS bandwidth slice (a global setting), lowered while capped workers run.

    ``lower`` saves the slice in force (unless a run before us already did) and sets
    ``FINE_SLICE_US``; ``restore`` puts the saved slice back once no launcher's groups are left
    (the last launcher to close restores it; ``remove_stale`` runs first, so the next run after
    a SIGKILLed launcher restores what it left). Without the file (another kernel) or the right
    to write it, the slice stays as it is and the caps use longer periods for small quotas.
    """
    path: Path = SLICE_FILE
    saved: Path = SAVED_SLICE_FILE

    def read(self) -> int | None:
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def original(self) -> int | None:
        """The kernel's own slice: the saved value while some launcher has lowered it."""
        try:
            return int(self.saved.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return self.read()

    def lower(self) -> int:
        """Set the fine slice; returns the slice in force afterwards (``quota_for``'s
        ``min_run_us``)."""
        current = self.read()
        if current is None:
            return MIN_RUN_US
        if current <= FINE_SLICE_US:
            return current
        try:
            if not self.saved.exists():
                self.saved.write_text(f"{current}\n")
            self.path.write_text(f"{FINE_SLICE_US}\n")
        except OSError:
            return current
        return FINE_SLICE_US

    def restore(self, root: Path) -> int | None:
        """Put the saved slice back when no launcher's groups remain in ``root``; returns the
        slice restored (None: nothing to do, or groups remain)."""
        if _groups_exist(root):
            return None
        try:
            value = int(self.saved.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            self.path.write_text(f"{value}\n")
            self.saved.unlink()
        except OSError:
            return None
        return value


# --- the groups of one launcher -----------------------------------------------------------------

class CpuCaps:
    """One cgroup per emulated device, each capped to a fraction of a core; a context manager.

    ``CpuCaps()`` finds the controller (``CgroupsUnavailable`` when there is none, saying why),
    removes what dead launchers left, and creates this launcher's parent group, weighing
    ``weight`` ordinary processes (``DEFAULT_WEIGHT``; None: the kernel's default of one) so that
    capped workers get their caps on a busy machine. ``cfs_slice`` (``CfsSlice``): lowered while
    the groups exist, so that small caps get short periods; by default only for the machine's
    own controller (found here, not passed in). ``cap`` creates a
    device's group and sets its quota, or changes it while the worker runs. Start a worker in its
    group with ``exec_prefix``, or move a running process with ``move``. ``close`` moves whatever
    is left to the root group and removes every group made here.
    """

    def __init__(self, controller: CpuController | None = None, *, clean_stale: bool = True,
                 weight: float | None = DEFAULT_WEIGHT, cfs_slice: CfsSlice | None = None):
        if cfs_slice is None and controller is None:
            cfs_slice = CfsSlice()
        self.controller = _controller(controller)
        self.cfs_slice = cfs_slice
        self.min_run_us = MIN_RUN_US          # the CFS bandwidth slice the periods allow for
        self.kernel_slice_us = None           # the slice before ours (None: not managed)
        if clean_stale:
            remove_stale(self.controller)
        if cfs_slice is not None:
            cfs_slice.restore(self.controller.root)      # what a SIGKILLed launcher left
        pid = os.getpid()
        self.path = self.controller.root / f"{PREFIX}-{pid}.{process_start_time(pid)}.{next(_instances)}"
        self._groups: dict[str, Path] = {}
        self._lock = threading.Lock()
        self._closed = False
        try:
            self.path.mkdir()
        except OSError as exc:
            raise CgroupError(exc.errno, f"creating {self.path}: {exc.strerror or exc}") from exc
        if self.controller.version == 2:
            why = _enable_cpu(self.path)
            if why:
                _rmdir(self.path)
                raise CgroupError(errno.EPERM, why)
        if weight is not None:
            try:
                self._set_weight(weight)
            except (CgroupError, ValueError):
                _rmdir(self.path)
                raise
        if cfs_slice is not None:
            self.min_run_us = cfs_slice.lower()
            self.kernel_slice_us = cfs_slice.original()   # also when another run lowered it

    def _set_weight(self, weight: float) -> None:
        if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"a CPU weight is a positive number of processes, not {weight!r}")
        if self.controller.version == 2:        # 1..10000, an ordinary process is 100
            _write(self.path / "cpu.weight", f"{min(10_000, max(1, round(100 * weight)))}\n")
        else:                                   # 2..262144, an ordinary process is 1024
            _write(self.path / "cpu.shares", f"{min(262_144, max(2, round(1024 * weight)))}\n")

    # groups and quotas

    def group(self, device: str) -> Path:
        """The directory of ``device``'s group (KeyError when ``cap`` never made it)."""
        return self._groups[device]

    @property
    def devices(self) -> list[str]:
        return list(self._groups)

    def cap(self, device: str, cores: float | None) -> Path:
        """Limit ``device``'s group to ``cores`` of CPU time (0.45: 45 ms per 100 ms; None: no
        cap), creating the group on first use; takes effect at once on the processes inside, so
        it also serves speed schedules. Returns the group's directory."""
        quota, period = quota_for(cores, self.min_run_us)
        with self._lock:
            if self._closed:
                raise CgroupError(errno.ENOENT, f"{self.path} is closed")
            group = self._groups.get(device)
            if group is None:
                if not DEVICE_RE.match(device):
                    raise ValueError(f"{device!r} cannot name a cgroup: use letters, digits, "
                                     "'_' and '-' (at most 64), starting with a letter or digit")
                group = self.path / device
                try:
                    group.mkdir()
                except OSError as exc:
                    raise CgroupError(exc.errno, f"creating {group}: "
                                                 f"{exc.strerror or exc}") from exc
                self._groups[device] = group
            if self.controller.version == 2:
                _write(group / "cpu.max", f"{'max' if quota is None else quota} {period}\n")
            else:
                # the kernel checks each write against the other value: with an unlimited
                # parent group any (quota, period) pair passes, in either order
                _write(group / "cpu.cfs_period_us", f"{period}\n")
                _write(group / "cpu.cfs_quota_us", f"{-1 if quota is None else quota}\n")
            return group

    def cores(self, device: str) -> float | None:
        """The cap in force, read back from the kernel (None: uncapped)."""
        group = self.group(device)
        if self.controller.version == 2:
            quota, period = (group / "cpu.max").read_text().split()
        else:
            quota = (group / "cpu.cfs_quota_us").read_text().strip()
            period = (group / "cpu.cfs_period_us").read_text().strip()
        return cores_from(quota, period)

    # processes

    def move(self, device: str, pid: int) -> None:
        """Put process ``pid`` (all its threads; its later children follow) into ``device``'s
        group. ProcessLookupError-like CgroupError (errno ESRCH) when it has exited."""
        _write(self.group(device) / "cgroup.procs", f"{pid}\n")

    def exec_prefix(self, device: str) -> list[str]:
        """argv prefix that starts a program already inside ``device``'s group:
        ``Popen(caps.exec_prefix("cpu2") + argv)``.

        The prefix is ``/bin/sh -c 'echo $$ > <group>/cgroup.procs && shift && exec "$@"'``: the
        shell moves itself into the group, then ``exec``s the program, which keeps its pid and
        so the group, as do its threads and children. Compared with moving the child from the
        launcher right after ``Popen``, the program never runs a moment uncapped (MXNet's import
        alone is a second of CPU); compared with ``preexec_fn``, it is safe in a threaded
        launcher and leaves ``preexec_fn`` to other uses (die-with-parent). If the move fails the
        shell prints why and exits non-zero without running the program: never silently
        uncapped. It composes with other exec wrappers (``ip netns exec`` ...) in either order.
        """
        procs = self.group(device) / "cgroup.procs"
        return ["/bin/sh", "-c", _SH_JOIN, "esync-cgroup", str(procs)]

    def pids(self, device: str) -> list[int]:
        """Processes in ``device``'s group now."""
        return _procs(self.group(device))

    # clean-up

    def close(self) -> None:
        """Move every process still in a group to the root group, then remove all our groups
        (retrying briefly while exiting tasks still count). Safe to call twice. CgroupError
        names what could not be removed; the next ``remove_stale`` after we exit takes it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            errors = []
            for group in list(self._groups.values()) + [self.path]:
                try:
                    _evacuate(group, self.controller.root)
                    _rmdir(group)
                except CgroupError as exc:
                    errors.append(str(exc))
            self._groups.clear()
            if self.cfs_slice is not None:
                self.cfs_slice.restore(self.controller.root)
            if errors:
                raise CgroupError(errno.EBUSY, "; ".join(errors) + " (python -m "
                                  "esync.emulation.cgroups clean removes it once this process "
                                  "ends)")

    def __enter__(self) -> "CpuCaps":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CpuCaps({self.path}, devices={self.devices})"


# --- how much CPU, and when ---------------------------------------------------------------------

def place_on_cpus(cores, cpus) -> list[int | None]:
    """The CPU each capped device's compute is pinned to (None for an uncapped device): the
    largest caps first, each on the CPU whose caps placed so far add up to the least (ties: the
    lowest number), so the caps spread over the cores as evenly as they can.

    Why pin: under caps alone the scheduler moves a device's compute from core to core, and the
    caches it leaves behind cost the x1 devices about 5% of their speed on a 2-core machine with
    a cache per core (docs/BENCHMARK.md, "Emulation"); a real device keeps its own."""
    cpus = sorted(cpus)
    if not cpus:
        raise ValueError("no CPU to pin devices to")
    load = dict.fromkeys(cpus, 0.0)
    placed: list[int | None] = [None] * len(cores)
    order = sorted((i for i, c in enumerate(cores) if c is not None), key=lambda i: -cores[i])
    for i in order:
        cpu = min(cpus, key=lambda c: (load[c], c))
        load[cpu] += cores[i]
        placed[i] = cpu
    return placed


def default_share(factors, cores: float, reserve: float = DEFAULT_RESERVE) -> float:
    """The largest share s <= 1.0 of a core for a x1 device such that the caps ``s / F_i`` of
    all devices plus ``reserve`` fit in ``cores``: sum(s / F_i) + reserve <= cores.

    Factors 1, 1, 4, 8 on 2 cores with the default reserve 0.8: s = 1.2 / 2.375 = 0.505.
    With a speed schedule pass each device's smallest factor, so the caps fit at every moment.
    """
    factors = list(factors)
    if not factors:
        raise ValueError("default_share needs at least one slow-down factor")
    for f in factors:
        if not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
            raise ValueError(f"a slow-down factor is a positive number, not {f!r}")
    if not reserve >= 0:
        raise ValueError(f"the reserve is a number of cores >= 0, not {reserve!r}")
    budget = cores - reserve
    if not budget > 0:
        raise ValueError(f"{cores:g} core(s) minus a reserve of {reserve:g} leaves nothing "
                         "for the workers")
    return min(1.0, budget / sum(1.0 / f for f in factors))


class SpeedShifter:
    """Applies a speed schedule to CPU-capped workers: at each change a device's cap becomes
    ``share / factor``, while the worker runs.

    Times count from the start of training, as in the logs' ``total_time`` (a change at 30 s
    shows at 30 s in the figures): the zero is read from the first round log that appears (its
    modification time minus its ``total_time``), so the job's start-up does not count.
    """

    POLL_SECONDS = 0.2

    def __init__(self, caps: CpuCaps, share: float, schedule: dict, folders: dict,
                 announce=None):
        self.caps, self.share, self.schedule = caps, share, schedule
        self.folders = folders            # {device: its log folder relative to the mode folder}
        self.announce = announce or (lambda line: print(line, file=sys.stderr, flush=True))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, mode_dir: Path) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(Path(mode_dir),),
                                            name="speed-shifter", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def training_started(self, mode_dir: Path) -> float | None:
        """The wall-clock time training started, from the first round log; None: not yet."""
        import json
        for folder in self.folders.values():
            first = runlayout.round_log(Path(mode_dir) / folder, 1)
            try:
                total = float(json.loads(first.read_text())["total_time"])
                return first.stat().st_mtime - total
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return None

    def _run(self, mode_dir: Path) -> None:
        start = None
        while start is None:
            if self._stop.wait(self.POLL_SECONDS):
                return
            start = self.training_started(mode_dir)
        changes = sorted((t, device, f) for device, points in self.schedule.items()
                         for t, f in points if device in self.folders)
        for at, device, factor in changes:
            if self._stop.wait(max(0.0, start + at - time.time())):
                return
            try:
                self.caps.cap(device, self.share / factor)
            except CgroupError as exc:       # the worker's group is gone: the job is ending
                self.announce(f"esync-cluster: speed schedule: {exc}")
                return
            self.announce(f"esync-cluster: {device} is now x{factor:g} "
                          f"({self.share / factor:.3f} of a core) at {at:g} s of training")


# --- command line -------------------------------------------------------------------------------

def main(argv=None) -> int:
    """``python -m esync.emulation.cgroups check|list|clean``: what this machine offers, the groups
    of esync launchers, or remove those of launchers that are gone."""
    parser = argparse.ArgumentParser(prog="python -m esync.emulation.cgroups",
                                     description=main.__doc__)
    parser.add_argument("action", choices=["check", "list", "clean"])
    args = parser.parse_args(argv)
    found = find_cpu_controller()
    if isinstance(found, str):
        print(f"esync.emulation.cgroups: CPU caps unavailable: {found}", file=sys.stderr)
        return 2
    if args.action == "check":
        print(found.describe())
    elif args.action == "clean":
        for group in remove_stale(found):
            print(f"removed {group}")
        restored = CfsSlice().restore(found.root)
        if restored is not None:
            print(f"restored the kernel's CFS bandwidth slice to {restored} us")
    else:
        for group in sorted(found.root.iterdir()):
            match = GROUP_RE.match(group.name)
            if match and group.is_dir():
                alive = _owner_alive(int(match[1]), int(match[2]))
                devices = sorted(p.name for p in group.iterdir() if p.is_dir())
                print(f"{group}\towner pid {match[1]} {'running' if alive else 'gone'}\t"
                      f"{' '.join(devices)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
