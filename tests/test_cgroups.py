"""CPU caps per emulated device (esync.emulation.cgroups): quotas, clean-up, schedules.

The cap tests run on the machine's real cgroup filesystem and skip, saying why, only when this
is impossible (not root, or no cgroup cpu controller). They compare CPU time that busy loops
report against their own wall time, so they hold on a slow or busy machine as long as it has a
core to spare. Every process a test starts is killed when the test ends, also when it fails;
every group it makes is removed.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from esync.emulation import cgroups
from esync.emulation.cgroups import (FINE_SLICE_US, CfsSlice, CgroupError, CpuCaps,
                                     CpuController, default_share, find_cpu_controller,
                                     quota_for, remove_stale)
from esync.emulation.schedules import (ScheduleError, factor_in_force, next_change,
                                       parse_speed_schedule)
from support import REPO

# A busy loop that prints "<monotonic seconds> <own CPU seconds since the loop began>" every
# 0.1 s of wall time for argv[1] seconds (CLOCK_MONOTONIC is the same in every process).
BUSY = r"""
import sys, time
seconds = float(sys.argv[1])
w0, c0, due = time.monotonic(), time.process_time(), 0.0
while True:
    now = time.monotonic()
    if now >= w0 + due:
        print(f"{now:.4f} {time.process_time() - c0:.4f}", flush=True)
        due += 0.1
    if now - w0 >= seconds:
        break
"""


@pytest.fixture(scope="module")
def controller():
    if os.geteuid() != 0:
        pytest.skip("CPU caps need root to create cgroups")
    found = find_cpu_controller()
    if isinstance(found, str):
        pytest.skip(f"no usable cgroup cpu controller: {found}")
    return found


@pytest.fixture
def procs():
    """``start(argv, **popen) -> Popen``; every process started is SIGKILLed at the end."""
    started = []

    def start(argv, **kwargs):
        proc = subprocess.Popen(argv, cwd=REPO, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


@pytest.fixture
def caps(controller):
    """A CpuCaps closed at the end (a test may close it first)."""
    made = CpuCaps(controller)
    yield made
    made.close()


def samples(proc):
    """(monotonic, cpu seconds) pairs a BUSY child printed, until it ends."""
    out = proc.stdout.read()
    proc.wait(timeout=10)
    assert proc.returncode == 0, f"busy loop exited with {proc.returncode}"
    return [tuple(map(float, line.split())) for line in out.splitlines()]


def rate(points, start, end):
    """CPU seconds per wall second between the samples nearest after ``start`` and ``end``."""
    inside = [p for p in points if start <= p[0] <= end]
    (w0, c0), (w1, c1) = inside[0], inside[-1]
    return (c1 - c0) / (w1 - w0)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def cpu_cgroup_of(pid):
    """The pid's group in the cpu controller's hierarchy ("/" is the root)."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    for _, controllers, path in lines:
        if "cpu" in controllers.split(","):
            return path                                    # v1
    return next(path for _, controllers, path in lines if controllers == "")     # v2


# caps on the real cgroup filesystem --------------------------------------------------------------

def test_busy_loop_gets_the_cores_its_group_allows(caps, procs):
    caps.cap("slow", 0.25)
    caps.cap("fast", 1.0)
    slow = procs(caps.exec_prefix("slow") + [sys.executable, "-c", BUSY, "2"],
                 stdout=subprocess.PIPE, text=True)
    fast = procs(caps.exec_prefix("fast") + [sys.executable, "-c", BUSY, "2"],
                 stdout=subprocess.PIPE, text=True)
    slow_points, fast_points = samples(slow), samples(fast)
    slow_rate = rate(slow_points, 0, float("inf"))
    fast_rate = rate(fast_points, 0, float("inf"))
    assert 0.15 <= slow_rate <= 0.35, f"capped at 0.25 core, used {slow_rate:.2f}"
    assert fast_rate > 2 * slow_rate, (f"capped at 1.0 core, used {fast_rate:.2f}; "
                                       f"the 0.25 one {slow_rate:.2f}")
    stat = dict(line.split() for line in (caps.group("slow") / "cpu.stat").read_text()
                .splitlines())
    assert int(stat["nr_throttled"]) > 0


def test_started_inside_its_group_from_the_first_instruction(caps, procs):
    caps.cap("cpu0", 0.5)
    child = procs(caps.exec_prefix("cpu0") + [sys.executable, "-c",
                                             "import os; print(os.getpid(), flush=True); "
                                             "import time; time.sleep(30)"],
                  stdout=subprocess.PIPE, text=True)
    pid = int(child.stdout.readline())
    assert pid == child.pid                # exec kept the pid the launcher knows
    assert caps.pids("cpu0") == [pid]
    assert cpu_cgroup_of(pid).endswith(f"/{caps.path.name}/cpu0")


def test_a_failed_move_never_runs_the_program_uncapped(caps, procs, tmp_path):
    caps.cap("cpu0", 0.5)
    marker = tmp_path / "ran"
    prefix = caps.exec_prefix("cpu0")
    prefix[-1] = str(caps.path / "no-such-group" / "cgroup.procs")
    child = procs(prefix + ["touch", str(marker)], stderr=subprocess.PIPE, text=True)
    assert child.wait(timeout=10) != 0
    assert "no-such-group" in child.stderr.read()
    assert not marker.exists()


def test_a_live_quota_change_takes_effect(caps, procs):
    caps.cap("cpu1", 0.2)
    child = procs(caps.exec_prefix("cpu1") + [sys.executable, "-c", BUSY, "2.6"],
                  stdout=subprocess.PIPE, text=True)
    points = [tuple(map(float, child.stdout.readline().split()))]
    began = points[0][0]
    while points[-1][0] < began + 1.2:
        points.append(tuple(map(float, child.stdout.readline().split())))
    changed = time.monotonic()
    caps.cap("cpu1", 0.8)
    assert caps.cores("cpu1") == pytest.approx(0.8)
    points += samples(child)
    before = rate(points, began + 0.2, changed)
    after = rate(points, changed + 0.3, float("inf"))
    assert 0.1 <= before <= 0.3, f"capped at 0.2 core, used {before:.2f}"
    assert after > 2 * before, f"raised to 0.8 core, used {after:.2f} (before: {before:.2f})"


def test_tiny_caps_use_a_longer_period(caps):
    caps.cap("crawl", 0.005)                  # 0.05 ms per 10 ms: under one 5 ms slice
    group = caps.group("crawl")
    if caps.controller.version == 1:
        assert (group / "cpu.cfs_quota_us").read_text().strip() == "5000"
        assert (group / "cpu.cfs_period_us").read_text().strip() == "1000000"
    else:
        assert (group / "cpu.max").read_text().split() == ["5000", "1000000"]
    assert caps.cores("crawl") == pytest.approx(0.005)
    caps.cap("crawl", None)
    assert caps.cores("crawl") is None


def test_groups_outweigh_ordinary_processes_up_to_their_caps(controller):
    with CpuCaps(controller) as heavy, CpuCaps(controller, weight=None) as plain:
        if controller.version == 1:
            assert (heavy.path / "cpu.shares").read_text().strip() == str(100 * 1024)
            assert (plain.path / "cpu.shares").read_text().strip() == "1024"
        else:
            assert (heavy.path / "cpu.weight").read_text().strip() == "10000"
            assert (plain.path / "cpu.weight").read_text().strip() == "100"
    with pytest.raises(ValueError, match="weight"):
        CpuCaps(controller, weight=0)


def test_bad_device_name_is_refused(caps):
    with pytest.raises(ValueError, match="cannot name a cgroup"):
        caps.cap("../escape", 0.5)
    with pytest.raises(ValueError, match="positive number"):
        caps.cap("cpu0", 0)


# clean-up ----------------------------------------------------------------------------------------

def test_close_moves_the_remaining_processes_out_and_removes_every_group(controller, procs):
    caps = CpuCaps(controller)
    try:
        caps.cap("cpu0", 0.5)
        caps.cap("cpu1", 0.25)
        sleeper = procs(caps.exec_prefix("cpu1") + ["sleep", "30"])
        deadline = time.monotonic() + 5
        while caps.pids("cpu1") != [sleeper.pid] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert caps.pids("cpu1") == [sleeper.pid]
    finally:
        caps.close()
    assert not caps.path.exists()
    assert sleeper.poll() is None, "close() must not kill anybody"
    assert cpu_cgroup_of(sleeper.pid) == "/"
    caps.close()                                   # twice is fine
    with pytest.raises(CgroupError):
        caps.cap("cpu0", 0.5)


def test_groups_are_removed_when_the_with_block_raises(controller):
    with pytest.raises(RuntimeError, match="boom"):
        with CpuCaps(controller) as caps:
            caps.cap("cpu0", 0.5)
            assert caps.group("cpu0").is_dir()
            raise RuntimeError("boom")
    assert not caps.path.exists()


OWNER = r"""
import os, subprocess, time
from esync.emulation.cgroups import CpuCaps
caps = CpuCaps()
caps.cap("cpu0", 0.5)
caps.cap("cpu1", 0.3)
worker = subprocess.Popen(caps.exec_prefix("cpu1") + ["sleep", "60"])
caps.move("cpu0", os.getpid())
print(caps.path, worker.pid, flush=True)
time.sleep(60)
"""


def start_owner(procs):
    """Start OWNER (a launcher with two capped groups); (its process, its parent group, the
    pid of the worker it started in cpu1)."""
    owner = procs([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                  env={**os.environ, "PYTHONPATH": str(REPO)})
    line = owner.stdout.readline()
    assert line, "the owner process died before creating its groups"
    return owner, Path(line.split()[0]), int(line.split()[1])


def test_remove_stale_cleans_what_a_sigkilled_launcher_left(controller, procs):
    owner, path, worker = start_owner(procs)
    try:
        assert (path / "cpu0").is_dir() and (path / "cpu1").is_dir()
        assert owner.pid in [int(p) for p in (path / "cpu0" / "cgroup.procs").read_text().split()]

        assert path not in remove_stale(controller), "a live owner's groups were removed"
        assert path.is_dir()

        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        assert path.is_dir()                       # nobody cleaned up...
        assert path in remove_stale(controller)    # ...until the next run
        assert not path.exists()
        assert pid_alive(worker) and cpu_cgroup_of(worker) == "/", \
            "an orphaned worker is moved out, not killed"
    finally:
        if worker is not None and pid_alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_the_cfs_slice_is_fine_while_caps_exist_and_restored_after_a_sigkill(controller,
                                                                            procs):
    kernel = CfsSlice()
    if kernel.read() is None:
        pytest.skip(f"this kernel has no {kernel.path}")
    if not os.access(kernel.path, os.W_OK):
        pytest.skip(f"{kernel.path} is read-only here (a container's /proc/sys)")
    remove_stale(controller)
    kernel.restore(controller.root)              # what an earlier killed run may have left
    if any(cgroups.GROUP_RE.match(p.name) for p in controller.root.iterdir()):
        pytest.skip("another launcher's CPU caps are running on this machine")
    original = kernel.read()
    fine = min(original, FINE_SLICE_US)
    with CpuCaps() as caps:                      # the machine's own controller: manages it
        assert kernel.read() == fine
        caps.cap("cpu3", 0.0789)                 # a x8 device: one slice per 12.7 ms period
        assert caps.cores("cpu3") == pytest.approx(0.0789, rel=1e-3)
        period = int((caps.group("cpu3") / "cpu.cfs_period_us").read_text())
        assert period == quota_for(0.0789, fine)[1]
        assert fine != 1_000 or period == 12_675
        with CpuCaps() as other:                 # a second launcher: the first value is kept
            assert kernel.read() == fine
            assert (other.min_run_us, other.kernel_slice_us) == (fine, original)
        assert kernel.read() == fine, "restored while another launcher's caps still ran"
    assert kernel.read() == original and not kernel.saved.exists()

    owner, _, worker = start_owner(procs)
    try:
        assert kernel.read() == fine
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        assert kernel.read() == fine                 # nobody restored it...
        with CpuCaps():                              # ...until the next run, which lowers it
            assert kernel.read() == fine             # again for itself
        assert kernel.read() == original and not kernel.saved.exists()
    finally:
        if worker is not None and pid_alive(worker):
            os.kill(worker, signal.SIGKILL)
        remove_stale(controller)
        kernel.restore(controller.root)


def test_cfs_slice_saves_the_first_value_and_restores_when_no_group_is_left(tmp_path):
    root = tmp_path / "cgroup"
    root.mkdir()
    knob = tmp_path / "sched_cfs_bandwidth_slice_us"
    knob.write_text("5000\n")
    fine = CfsSlice(knob, tmp_path / "saved")
    assert fine.lower() == FINE_SLICE_US and knob.read_text() == f"{FINE_SLICE_US}\n"
    assert fine.lower() == FINE_SLICE_US                   # a second launcher
    assert fine.saved.read_text() == "5000\n"              # still the kernel's own value
    assert fine.original() == 5000 and fine.read() == FINE_SLICE_US
    (root / "esync-1.2.0").mkdir()                          # some launcher's groups remain
    assert fine.restore(root) is None and knob.read_text() == f"{FINE_SLICE_US}\n"
    (root / "esync-1.2.0").rmdir()
    (root / "unrelated").mkdir()
    assert fine.restore(root) == 5000 and knob.read_text() == "5000\n"
    assert not fine.saved.exists() and fine.restore(root) is None
    knob.write_text("500\n")                               # already finer: left alone
    assert fine.lower() == 500 and not fine.saved.exists()
    assert CfsSlice(tmp_path / "missing", tmp_path / "saved").lower() == cgroups.MIN_RUN_US
    knob.write_text("5000\n")
    knob.chmod(0o444)
    try:
        if not os.access(knob, os.W_OK):                     # root may write anyway
            assert fine.lower() == 5000                      # unwritable: caps use 5 ms runs
    finally:
        knob.chmod(0o644)


def test_caps_with_a_fine_slice_give_small_caps_short_periods(tmp_path):
    knob = tmp_path / "sched_cfs_bandwidth_slice_us"
    knob.write_text("5000\n")
    (tmp_path / "cgroup").mkdir()
    caps = CpuCaps(CpuController(2, tmp_path / "cgroup"), clean_stale=False,
                   cfs_slice=CfsSlice(knob, tmp_path / "saved"))   # plain files: no close()
    assert knob.read_text() == f"{FINE_SLICE_US}\n" and caps.min_run_us == FINE_SLICE_US
    caps.cap("cpu3", 0.0789474)
    assert (caps.group("cpu3") / "cpu.max").read_text() == "1000 12667\n"
    caps.cap("cpu0", 0.6315)
    assert (caps.group("cpu0") / "cpu.max").read_text() == "6315 10000\n"


def test_remove_stale_tells_a_reused_pid_from_its_owner(controller):
    me = os.getpid()
    real_start = int(Path(f"/proc/{me}/stat").read_text().rsplit(")", 1)[1].split()[19])
    ghost = controller.root / f"esync-{me}.{real_start + 1}.99"    # our pid, another process
    ghost.mkdir()
    (ghost / "cpu0").mkdir()
    try:
        with CpuCaps(controller) as caps:          # clears stale groups as it starts
            assert not ghost.exists()
            assert caps.path.name.startswith(f"esync-{me}.{real_start}.")
            assert caps.path not in remove_stale(controller)
    finally:
        for group in (ghost / "cpu0", ghost):
            if group.exists():
                group.rmdir()


# finding the controller (fake hierarchies in a temporary folder) -------------------------------

def mountinfo(*mounts):
    """mountinfo lines for (mount point, fstype, super options, mount options)."""
    return "\n".join(f"{30 + i} 23 0:{40 + i} / {point} {opts} shared:{i} - {fstype} cgroup "
                     f"{sup}" for i, (point, fstype, sup, opts) in enumerate(mounts)) + "\n"


def test_finds_v1_cpu_hierarchy_wherever_it_is_mounted(tmp_path):
    point = tmp_path / "cpu,cpuacct"
    point.mkdir()
    (point / "cpu.cfs_quota_us").write_text("-1\n")
    text = ("22 1 0:21 / /proc rw - proc proc rw\n"
            + mountinfo((tmp_path / "memory", "cgroup", "rw,memory", "rw"),
                        (point, "cgroup", "rw,cpu,cpuacct", "rw,nosuid")))
    assert find_cpu_controller(text) == CpuController(1, point)


def test_mountinfo_octal_escapes_are_decoded(tmp_path):
    point = tmp_path / "with space"
    point.mkdir()
    (point / "cpu.cfs_quota_us").write_text("-1\n")
    escaped = str(point).replace(" ", "\\040")
    assert find_cpu_controller(mountinfo((escaped, "cgroup", "rw,cpu", "rw"))) == \
        CpuController(1, point)


def test_v2_is_preferred_and_cpu_enabled_for_children(tmp_path):
    unified, v1 = tmp_path / "unified", tmp_path / "cpu"
    for d in (unified, v1):
        d.mkdir()
    (unified / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (unified / "cgroup.subtree_control").write_text("memory\n")
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    text = mountinfo((unified, "cgroup2", "rw", "rw"), (v1, "cgroup", "rw,cpu", "rw"))
    assert find_cpu_controller(text) == CpuController(2, unified)
    assert (unified / "cgroup.subtree_control").read_text() == "+cpu"


def test_hybrid_without_cpu_in_v2_uses_v1(tmp_path):
    unified, v1 = tmp_path / "unified", tmp_path / "cpu"
    for d in (unified, v1):
        d.mkdir()
    (unified / "cgroup.controllers").write_text("hugetlb\n")
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    text = mountinfo((unified, "cgroup2", "rw", "rw"), (v1, "cgroup", "rw,cpu", "rw"))
    assert find_cpu_controller(text) == CpuController(1, v1)


def test_no_usable_controller_says_why(tmp_path):
    assert "no cgroup cpu controller" in find_cpu_controller("22 1 0:21 / /proc rw - proc p rw\n")
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    why = find_cpu_controller(mountinfo((tmp_path, "cgroup", "rw,cpu", "ro,nosuid")))
    assert why == f"{tmp_path} is mounted read-only"
    (tmp_path / "cpu.cfs_quota_us").unlink()
    assert "CONFIG_CFS_BANDWIDTH" in find_cpu_controller(
        mountinfo((tmp_path, "cgroup", "rw,cpu", "rw")))


def test_caps_refuse_to_start_without_a_controller(monkeypatch):
    monkeypatch.setattr(cgroups, "find_cpu_controller", lambda: "creating groups needs root")
    with pytest.raises(cgroups.CgroupsUnavailable, match="CPU caps unavailable: creating groups"):
        CpuCaps()
    assert remove_stale() == []


def test_v2_quota_is_written_to_cpu_max(tmp_path):
    caps = CpuCaps(CpuController(2, tmp_path), clean_stale=False)   # plain files: no close()
    assert (caps.path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (caps.path / "cpu.weight").read_text() == "10000\n"
    caps.cap("cpu1", 0.45)
    assert (caps.group("cpu1") / "cpu.max").read_text() == "5000 11112\n"
    assert caps.cores("cpu1") == pytest.approx(0.45, rel=1e-3)     # the period is whole us
    caps.cap("cpu1", None)
    assert (caps.group("cpu1") / "cpu.max").read_text() == "max 10000\n"


# pure functions ----------------------------------------------------------------------------------

def test_quota_is_a_fraction_of_one_core():
    assert quota_for(0.45) == (5_000, 11_112)            # at least a 5 ms slice per period
    assert quota_for(0.5) == (5_000, 10_000)
    assert quota_for(1) == (10_000, 10_000)
    assert quota_for(1.5) == (15_000, 10_000)
    assert quota_for(0.005) == (5_000, 1_000_000)       # at least a 5 ms slice per period
    assert quota_for(0.1) == (5_000, 50_000)
    assert quota_for(0.001) == (1_000, 1_000_000)       # the kernel.s 1 ms floor
    assert quota_for(None) == (None, 10_000)
    assert quota_for(0.0789474, 1_000) == (1_000, 12_667)   # with the fine slice
    assert quota_for(0.1, 1_000) == (1_000, 10_000)
    assert quota_for(0.0789474, 200) == (1_000, 12_667)     # never under the kernel's 1 ms
    for bad in (0, -0.5, float("nan"), float("inf"), 0.0005):
        with pytest.raises(ValueError):
            quota_for(bad)


def test_default_share_fits_the_caps_and_the_reserve_in_the_cores():
    share = default_share([1, 1, 4, 8], cores=2, reserve=0.5)
    assert share == pytest.approx(1.5 / 2.375) and round(share, 2) == 0.63
    assert sum(share / f for f in [1, 1, 4, 8]) + 0.5 == pytest.approx(2)
    assert default_share([4, 8], cores=2) == 1.0                  # never above one core
    assert default_share([1], cores=2, reserve=0) == 1.0
    assert default_share([1, 1, 1], cores=2, reserve=0.5) == pytest.approx(0.5)
    assert default_share([1, 2], cores=1.5) == pytest.approx(0.7 / 1.5)   # default reserve 0.8
    assert round(default_share([1, 1, 4, 8], cores=2), 3) == 0.505


@pytest.mark.parametrize("factors, cores, reserve, message", [
    ([], 2, 0.5, "at least one"),
    ([1, 0], 2, 0.5, "positive number"),
    ([1, -2], 2, 0.5, "positive number"),
    ([1], 0.5, 0.5, "leaves nothing"),
    ([1], 2, -1, "reserve"),
])
def test_default_share_refuses_impossible_input(factors, cores, reserve, message):
    with pytest.raises(ValueError, match=message):
        default_share(factors, cores, reserve)


def test_speed_schedule_parses_and_sorts_by_time():
    assert parse_speed_schedule("cpu1:1@0,6@30;cpu2:2@10") == {
        "cpu1": [(0.0, 1.0), (30.0, 6.0)], "cpu2": [(10.0, 2.0)]}
    assert parse_speed_schedule(" cpu1 : 6@30 , 1@0 ; gpu0-2:1.5@2.5 ;") == {
        "cpu1": [(0.0, 1.0), (30.0, 6.0)], "gpu0-2": [(2.5, 1.5)]}


@pytest.mark.parametrize("text, names", [
    ("", "''"),
    (";", "';'"),
    ("cpu1", "'cpu1' is not DEVICE:FACTOR@SECONDS"),
    ("cpu1:", "'cpu1:'"),
    ("cpu1:6", "'6' in 'cpu1:6' is not FACTOR@SECONDS"),
    ("cpu1:1@0,6", "'6' in 'cpu1:1@0,6'"),
    ("cpu1:x@3", "factor 'x'"),
    ("cpu1:2@soon", "time 'soon'"),
    ("cpu1:2@nan", "time 'nan'"),
    ("cpu1:6@-1", "time '-1'"),
    ("cpu1:0.5@0", "factor '0.5'"),
    ("cpu1:1@0,2@0.0", "two factors at 0.0 s"),
    ("cpu1:1@0;cpu1:2@5", "'cpu1' appears twice"),
    ("cpu 1:1@0", "'cpu 1'"),
    ("../x:1@0", "'../x'"),
])
def test_bad_speed_schedule_names_the_token(text, names):
    with pytest.raises(ScheduleError) as caught:
        parse_speed_schedule(text)
    assert names in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert "\n" not in str(caught.value)


def test_speed_schedule_knows_the_run_s_devices():
    assert parse_speed_schedule("cpu1:4@5", devices=["cpu0", "cpu1"]) == {"cpu1": [(5.0, 4.0)]}
    with pytest.raises(ScheduleError, match="no device 'cpu7'.*cpu0, cpu1"):
        parse_speed_schedule("cpu7:4@5", devices=["cpu0", "cpu1"])


def test_factor_in_force_and_next_change():
    changes = parse_speed_schedule("cpu1:2@10,6@30,1@45")["cpu1"]
    assert [factor_in_force(changes, t, initial=4) for t in (0, 9.99, 10, 29, 30, 44, 45, 1e6)] \
        == [4, 4, 2, 2, 6, 6, 1, 1]
    assert [next_change(changes, t) for t in (0, 10, 29.5, 45)] == [10, 30, 30, None]
    assert factor_in_force([], 100, initial=3) == 3 and next_change([], 0) is None


def test_the_cpu_a_cap_rations_leaves_out_the_threads_outside_it():
    """Round logs' cpu_time under a cap: a busy communication thread or training thread (both
    outside the cap) adds nothing; a thread that joins the cap, as MXNet's engine does, counts."""
    from concurrent.futures import ThreadPoolExecutor
    from esync.common import speeds
    with speeds.communication_threads():
        talker = ThreadPoolExecutor(1)
        talker_id = talker.submit(threading.get_native_id).result()
    training, engine = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    training_id = training.submit(threading.get_native_id).result()
    engine.submit(int).result()
    speeds._TRAINING_THREADS.add(training_id)
    work = 12_000_000                                        # ~0.3 s of one core
    try:
        for outside_cap in (talker, training):
            whole, capped = time.process_time(), speeds.cpu_seconds_under_cap()
            outside_cap.submit(sum, range(work)).result()
            outside = time.process_time() - whole
            assert outside > 0.1
            assert speeds.cpu_seconds_under_cap() - capped < 0.3 * outside
        capped = speeds.cpu_seconds_under_cap()
        engine.submit(sum, range(work)).result()             # the same work under the cap
        assert speeds.cpu_seconds_under_cap() - capped > 0.5 * outside
    finally:
        speeds._TRAINING_THREADS.discard(training_id)
        speeds._COMMUNICATION_THREADS.discard(talker_id)
        for pool in (talker, training, engine):
            pool.shutdown()


ENGINE_THREADS = r"""
import json, os
os.environ["MXNET_CPU_WORKER_NTHREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
from esync.common import speeds
from esync.worker import trainer
import mxnet as mx
def ticks():
    return {tid: speeds._thread_cpu_seconds(tid) for tid in speeds.thread_ids()}
def busiest(ctx):
    a = mx.nd.ones((400, 400), ctx=ctx)
    before = ticks()
    for _ in range(40):
        a = mx.nd.dot(a, a) / 400
    a.wait_to_read()
    after = ticks()
    return max(after, key=lambda t: after[t] - before.get(t, 0))
trainer.record_host_engine_threads()
host = set(speeds._COMMUNICATION_THREADS)
known = speeds.thread_ids()
device_ctx = mx.cpu(trainer.CPU_DEVICE_ID)
mx.nd.zeros((1,), ctx=device_ctx).wait_to_read()
device = speeds.thread_ids() - known
print(json.dumps({"host": sorted(host), "device": sorted(device),
                  "device_busiest": busiest(device_ctx), "host_busiest": busiest(mx.cpu(0))}))
"""


def test_the_device_context_computes_on_threads_apart_from_the_hosts():
    """A CPU worker trains on MXNet's CPU context 1: its operators run on engine threads of
    their own, made on its first operation, while context 0's (where the KVStore pushes and
    pulls) were recorded as the host's before. The cap can hold the first set alone."""
    import json
    out = subprocess.run([sys.executable, "-c", ENGINE_THREADS], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    threads = json.loads(out.stdout.splitlines()[-1])
    host, device = set(threads["host"]), set(threads["device"])
    assert host and device and not host & device, threads
    assert threads["device_busiest"] in device, threads
    assert threads["host_busiest"] in host, threads


LEAVER = r"""
import json, os, sys, threading
from esync.common import speeds
def groups():
    return sorted({open(f"/proc/self/task/{t}/cgroup").read() for t in speeds.thread_ids()})
def group_of(tid):
    return open(f"/proc/self/task/{tid}/cgroup").read()
before = groups()
stop = threading.Event()
engine = threading.Thread(target=stop.wait, daemon=True)     # a second thread, as MXNet's
engine.start()
holds = speeds.join_cpu_cap()[1]
print(json.dumps([before, holds, group_of(engine.native_id),
                  group_of(threading.get_native_id())]), flush=True)
speeds.leave_cpu_cap()
print(json.dumps(groups()), flush=True)
stop.set()
"""


def test_a_worker_leaves_its_cap_with_every_thread_once_training_is_over(caps, procs):
    """After training a worker goes back where it came from: its exit is not the device's work
    (under a x8 cap it held every run up by seconds), and the group empties for its removal."""
    import json
    caps.cap("cpu3", 0.05)
    from esync.common import speeds
    from esync.common.speeds import CPU_CGROUP_ENV
    env = dict(os.environ, PYTHONPATH=str(REPO), **{CPU_CGROUP_ENV: str(caps.path / "cpu3")})
    proc = procs([sys.executable, "-c", LEAVER], env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    joined, left = out.splitlines()
    before, holds, engine, training = json.loads(joined)
    assert len(before) == 1                      # every thread in one group at the start
    assert "esync-" in engine and "cpu3" in engine, engine
    if holds == speeds.OPERATOR_THREADS:         # the training thread stays at the host's speed
        assert [training] == before
    else:
        assert holds == speeds.EVERY_THREAD and training == engine
    assert json.loads(left) == before
    assert caps.pids("cpu3") == []


@pytest.mark.parametrize("cores, cpus, placed", [
    ([0.5, 0.5, 0.125, 0.0625], [0, 1], [0, 1, 0, 1]),       # the default cluster on 2 cores
    ([0.0625, 0.125, 0.5, 0.5], [0, 1], [1, 0, 0, 1]),       # largest first, wherever listed
    ([0.5, None, 0.5], [3, 2], [2, None, 3]),                # an uncapped device is not pinned
    ([0.3] * 5, [0, 1], [0, 1, 0, 1, 0]),                    # more devices than cores
    ([], [0], []),
])
def test_devices_are_placed_on_the_least_loaded_cpu_largest_caps_first(cores, cpus, placed):
    from esync.emulation.cgroups import place_on_cpus
    assert place_on_cpus(cores, cpus) == placed


def test_placing_devices_without_any_cpu_is_refused():
    from esync.emulation.cgroups import place_on_cpus
    with pytest.raises(ValueError, match="no CPU"):
        place_on_cpus([0.5], [])


PINNED = r"""
import json, os, sys, threading
from esync.common import speeds
def cpus():
    return sorted({tuple(sorted(os.sched_getaffinity(t))) for t in speeds.thread_ids()})
stop = threading.Event()
with speeds.communication_threads():
    talker = threading.Thread(target=stop.wait, daemon=True)      # as ps-lite's threads
    talker.start()
engine = threading.Thread(target=stop.wait, daemon=True)          # as MXNet's engine thread
engine.start()
before = cpus()
holds = speeds.join_cpu_cap()[1]
print(json.dumps([before, holds, sorted(os.sched_getaffinity(engine.native_id)),
                  sorted(os.sched_getaffinity(talker.native_id)),
                  sorted(os.sched_getaffinity(0))]), flush=True)
speeds.leave_cpu_cap()
print(json.dumps(cpus()), flush=True)
stop.set()
"""


def test_a_capped_worker_computes_on_the_cpu_its_launcher_chose(caps, procs):
    """ESYNC_CPU_PIN: the threads that join the cap (MXNet's engine workers) run on that CPU
    only; the training thread and the communication threads stay free; leaving the cap frees
    every thread again."""
    import json
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("pinning is only visible with two or more CPUs to choose from")
    caps.cap("cpu2", 0.5)
    from esync.common import speeds
    from esync.common.speeds import CPU_CGROUP_ENV, CPU_PIN_ENV
    pin = allowed[-1]
    env = dict(os.environ, PYTHONPATH=str(REPO),
               **{CPU_CGROUP_ENV: str(caps.path / "cpu2"), CPU_PIN_ENV: str(pin)})
    proc = procs([sys.executable, "-c", PINNED], env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    during, after = out.splitlines()
    before, holds, engine, talker, training = json.loads(during)
    assert before == [allowed]
    assert engine == [pin]
    assert talker == allowed
    assert training == (allowed if holds == speeds.OPERATOR_THREADS else [pin])
    assert json.loads(after) == [allowed]


def test_an_unusable_cpu_leaves_the_threads_where_they_were(capsys):
    from esync.common import speeds
    before = os.sched_getaffinity(0)
    speeds.pin_compute_threads("4096", speeds.thread_ids())
    assert os.sched_getaffinity(0) == before
    assert "cannot pin this device's compute to CPU '4096'" in capsys.readouterr().err
    speeds.pin_compute_threads(None, speeds.thread_ids())        # not asked: nothing to do
    assert os.sched_getaffinity(0) == before


def test_a_caps_cpu_is_counted_for_the_threads_in_its_group_to_the_millisecond(tmp_path):
    """``capped_cpu_seconds`` sums the threads its group's ``tasks`` lists (MXNet's engine
    workers, however late they started) and no other: a warm-up probe of a few milliseconds
    must not read as 0 or 10 ms, as the ticks of /proc's ``stat`` would."""
    from concurrent.futures import ThreadPoolExecutor
    from esync.common import speeds
    inside, outside = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    tid = inside.submit(threading.get_native_id).result()
    outside.submit(int).result()
    (tmp_path / "tasks").write_text(f"{tid}\n{os.getpid() + 10**7}\n")   # a task not ours
    try:
        before = speeds.capped_cpu_seconds(str(tmp_path))
        outside.submit(sum, range(4_000_000)).result()
        assert speeds.capped_cpu_seconds(str(tmp_path)) - before < 0.002
        start = time.thread_time
        spent = inside.submit(lambda: (t := start(), sum(range(120_000)), start() - t)[2]).result()
        counted = speeds.capped_cpu_seconds(str(tmp_path)) - before
        assert 0.001 < spent < 0.05
        assert counted == pytest.approx(spent, rel=0.3, abs=0.0005)
    finally:
        inside.shutdown()
        outside.shutdown()
    # without a per-thread tasks file (cgroup v2's whole process): the process's CPU
    assert speeds.capped_cpu_seconds(str(tmp_path / "none")) == pytest.approx(
        time.process_time(), abs=0.05)


@pytest.mark.parametrize("files, cores", [
    ({"cpu.cfs_quota_us": "3000\n", "cpu.cfs_period_us": "10000\n"}, 0.3),
    ({"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu.max": "1000 53334\n"}, 1000 / 53334),
    ({"cpu.max": "max 100000\n"}, None),
    ({}, None)])
def test_a_caps_cores_are_read_back_from_its_group(tmp_path, files, cores):
    from esync.common import speeds
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert speeds.cap_cores(str(tmp_path)) == (None if cores is None else pytest.approx(cores))


def test_a_probe_under_a_cap_lasts_its_cpu_at_the_caps_rate():
    """The same few milliseconds of CPU under a x1 cap and a x16 one: their ratio is the
    devices', whatever CFS's burst and periods did to the probes' wall times."""
    from esync.common.speeds import cap_seconds
    x1, x16 = cap_seconds(0.0027, 0.3), cap_seconds(0.0027, 0.3 / 16)
    assert x1 == pytest.approx(0.009) and x16 / x1 == pytest.approx(16)
