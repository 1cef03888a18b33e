"""Emulated devices by CPU caps in a real cluster: speeds, speed schedules, shards, clean-up.

Every cluster here runs through the launcher on loopback with `--emulation cpu-cap` (root and a
cgroup cpu controller; the tests skip, saying why, without them).
"""
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from support import Launchers, run_cluster, wait_for_rounds

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="CPU caps need root to create cgroups")
SHIFT_AT = 10.0           # seconds of training when cpu0 becomes as slow as cpu1


def _controller_or_skip():
    from esync.emulation.cgroups import find_cpu_controller
    found = find_cpu_controller()
    if isinstance(found, str):
        pytest.skip(f"no usable cgroup cpu controller: {found}")
    return found


def _our_groups(controller, launcher_pid: int) -> list[Path]:
    return [p for p in controller.root.glob(f"esync-{launcher_pid}.*") if p.is_dir()]


def _iterations(device_dir: Path):
    """(training seconds at the round's end, compute seconds per iteration) of every round."""
    rows = []
    for path in device_dir.glob("iter-*.txt"):
        log = json.loads(path.read_text())
        phases = list(log["time"].values())
        busy = sum(p.get("forward and backward", 0.0) + p.get("local update", 0.0)
                   for p in phases)
        if phases:
            rows.append((log["total_time"], busy / len(phases), len(phases), log))
    return sorted(rows, key=lambda r: r[0])


def _cpu_rate(rows) -> float:
    """Cores the worker used between the first and the last of ``rows`` (its CPU seconds over
    training seconds): what its cap rations."""
    first, last = rows[0][3], rows[-1][3]
    return (last["cpu_time"] - first["cpu_time"]) / (last["total_time"] - first["total_time"])


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory):
    """Two ESync workers on loopback, x1 and x4 under CPU caps of 0.4 and 0.1 core; cpu0
    becomes x4 at SHIFT_AT s of training. The caps leave the machine's other core to the
    parameter server, the evaluator and the state server, so each worker gets its cap."""
    _controller_or_skip()
    from support import write_fashion_dir
    root = tmp_path_factory.mktemp("caps")
    data = write_fashion_dir(root / "data", train_per_class=200, test_per_class=20)
    done = run_cluster(root / "logs", data, "-m", "esync", "--workers", 2, "--slowdown", "1,4",
                       "--emulation", "cpu-cap", "--cpu-share", "0.4", "-b", 32,
                       "--speed-schedule", f"cpu0:1@0,4@{SHIFT_AT:g}",
                       "--max-seconds", 2 * SHIFT_AT + 4, "-e", 5,
                       "--comm-share", 1,      # the caps under test, not stretched rounds
                       timeout=240)
    return root / "logs" / "lenet" / "esync", done


@ROOT_ONLY
def test_a_capped_workers_compute_rate_follows_its_factor(capped_run):
    mode_dir, _ = capped_run
    host = next(p for p in mode_dir.iterdir() if p.is_dir() and (p / "cpu0").is_dir())
    # Skip the first rounds (warm-up) and stay before the schedule's change.
    fast = [r for r in _iterations(host / "cpu0") if 2.0 < r[0] < SHIFT_AT - 1]
    slow = [r for r in _iterations(host / "cpu1") if 2.0 < r[0] < SHIFT_AT - 1]
    ratio = _cpu_rate(fast) / _cpu_rate(slow)
    assert 4 * 0.75 <= ratio <= 4 * 1.25, f"x1 / x4 compute rate {ratio:.2f}, expected ~4"


@ROOT_ONLY
def test_a_speed_schedule_slows_the_devices_compute_when_it_says(capped_run):
    mode_dir, done = capped_run
    host = next(p for p in mode_dir.iterdir() if p.is_dir() and (p / "cpu0").is_dir())
    rows = _iterations(host / "cpu0")
    before = [r for r in rows if 2.0 < r[0] < SHIFT_AT - 1]
    after = [r for r in rows if r[0] > SHIFT_AT + 2]
    assert before and after, "the run did not span the schedule's change"
    ratio = _cpu_rate(before) / _cpu_rate(after)
    assert 4 * 0.75 <= ratio <= 4 * 1.25, f"compute rate before / after {ratio:.2f}, expected ~4"
    assert {r[3]["slowdown"] for r in before} == {1.0}
    assert {r[3]["slowdown"] for r in after} == {4.0}
    assert "cpu0 is now x4" in done.stderr


@ROOT_ONLY
def test_the_run_records_its_emulation_and_pins_each_device_to_its_shard(capped_run):
    mode_dir, _ = capped_run
    cluster = json.loads((mode_dir / "cluster.json").read_text())
    assert cluster["emulation"] == "cpu-cap"
    assert cluster["cpu_share"] == 0.4
    from esync.emulation.cgroups import FINE_SLICE_US, CfsSlice
    kernel = CfsSlice()
    if kernel.read() is not None:        # the caps ran with the fine slice where it can be set
        fine = os.access(kernel.path, os.W_OK)
        assert cluster["cfs_slice_us"] == (min(FINE_SLICE_US, kernel.read()) if fine
                                           else kernel.read())
    placement = cluster["placement"]
    assert [(p["device"], p["shard"], p["cpu_cores"]) for p in placement] == [
        ("cpu0", 0, 0.4), ("cpu1", 1, 0.1)]
    from esync.emulation.cgroups import place_on_cpus       # each computes on one CPU
    assert [p["cpu"] for p in placement] == place_on_cpus([0.4, 0.1], os.sched_getaffinity(0))
    for entry in placement:
        logs = [r[3] for r in _iterations(mode_dir / entry["host"] / entry["device"])]
        assert {log["shard"] for log in logs} == {entry["shard"]}
        assert {log["emulation"] for log in logs} == {"cpu-cap"}


@ROOT_ONLY
def test_no_cgroup_is_left_after_a_normal_end(capped_run):
    controller = _controller_or_skip()
    assert [p for p in controller.root.glob("esync-*") if p.is_dir()] == []
    from esync.emulation.cgroups import CfsSlice
    assert not CfsSlice().saved.exists(), "the kernel's CFS bandwidth slice was not restored"


def _start(tmp_path, fashion_data_dir, launchers, *extra, batch=8):
    return launchers("-ld", tmp_path / "logs", "-dd", fashion_data_dir, "--quiet", "-m", "sync",
                     "--workers", 2, "--slowdown", "1,2", "--emulation", "cpu-cap", "-b", batch,
                     *extra)


def _wait_for_groups(controller, proc, timeout=90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        groups = _our_groups(controller, proc.pid)
        if groups and any(p.is_dir() for p in groups[0].iterdir()):
            return groups
        assert proc.poll() is None, f"launcher ended early: {proc.communicate()}"
        time.sleep(0.2)
    raise AssertionError("the launcher made no cgroup")


@ROOT_ONLY
def test_ctrl_c_removes_the_cgroups(tmp_path, fashion_data_dir):
    controller = _controller_or_skip()
    launchers = Launchers(tmp_path)
    try:
        proc = _start(tmp_path, fashion_data_dir, launchers, "--max-seconds", 120)
        _wait_for_groups(controller, proc)
        wait_for_rounds(proc, tmp_path / "logs" / "lenet" / "sync", 2)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert _our_groups(controller, proc.pid) == []
    finally:
        launchers.remove_all()


def _user_ticks(pid: int) -> dict:
    """{thread id: user CPU ticks so far} of process ``pid``'s threads."""
    ticks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ticks[int(task.name)] = int(task.joinpath("stat").read_text()
                                        .rsplit(")", 1)[1].split()[11])
        except (OSError, ValueError, IndexError):
            pass                                     # a thread that just ended
    return ticks


@ROOT_ONLY
def test_the_cap_holds_a_workers_compute_and_not_its_communication(tmp_path, fashion_data_dir):
    """While a capped job trains, each worker's busiest thread (MXNet's engine thread for the
    device's context, which runs the operators) is alone in its device's group: the training thread
    (Python: the batch, the dispatch), the threads ps-lite and ZeroMQ started and the engine's
    threads for the host's context (the KVStore's push and pull) are not (cgroup v1 places threads
    one by one; on v2 the whole process is capped, as its log says)."""
    controller = _controller_or_skip()
    launchers = Launchers(tmp_path)
    try:
        # Batches of 64: the operators' work per iteration outweighs Python's (at 8 the main
        # thread's dispatch and waits outran the capped engine thread on a loaded machine, CI)
        proc = _start(tmp_path, fashion_data_dir, launchers, "--max-seconds", 120, batch=64)
        groups = _wait_for_groups(controller, proc)
        wait_for_rounds(proc, tmp_path / "logs" / "lenet" / "sync", 3)
        group = groups[0] / "cpu1"
        pid = int(group.joinpath("cgroup.procs").read_text().split()[0])
        inside = {int(t) for t in group.joinpath("tasks").read_text().split()} \
            if controller.version == 1 else None
        # what each thread computes while training (start-up ran before the cap, uncapped)
        before = _user_ticks(pid)
        time.sleep(3)
        after = _user_ticks(pid)
        threads = {tid: ticks - before.get(tid, 0) for tid, ticks in after.items()}
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        log = (tmp_path / "logs" / "lenet" / "sync" / "processes" / "worker-cpu1.log").read_text()
        if controller.version != 1:
            assert "(every thread)" in log
            return
        assert "(MXNet's operator threads; Python and communication at the host's speed)" in log
        busiest = max(threads, key=threads.get)
        # the group holds the device's context's one engine thread (one compute thread), the
        # busiest; not the main thread (pid), nor the host context's engine threads, where the
        # KVStore's push and pull run
        assert inside == {busiest}, (threads, inside)
        outside = set(threads) - inside
        assert len(outside) >= 3, (threads, inside)      # ps-lite's, ZeroMQ's, the training's
    finally:
        launchers.remove_all()


@ROOT_ONLY
def test_the_next_run_removes_what_a_sigkilled_launcher_left(tmp_path, fashion_data_dir):
    controller = _controller_or_skip()
    launchers = Launchers(tmp_path)
    try:
        proc = _start(tmp_path, fashion_data_dir, launchers, "--max-seconds", 120)
        _wait_for_groups(controller, proc)
        proc.kill()
        proc.wait(timeout=30)
        assert _our_groups(controller, proc.pid), "nothing was left to clean: the test is moot"
        launchers.remove_all()                  # its workers die with it (parent-death signal)
        run_cluster(tmp_path / "next", fashion_data_dir, "-m", "sync", "--workers", 2,
                    "--emulation", "cpu-cap", "-b", 8, "--max-rounds", 2)
        assert _our_groups(controller, proc.pid) == []
    finally:
        launchers.remove_all()


def test_two_runs_give_the_same_device_to_shard_map(tmp_path, fashion_data_dir):
    maps = []
    for run in ("a", "b"):
        run_cluster(tmp_path / run, fashion_data_dir, "-m", "sync", "--workers", 3, "-b", 8,
                    "--max-rounds", 2)
        mode_dir = tmp_path / run / "lenet" / "sync"
        maps.append({(log.parent.name, json.loads(log.read_text())["shard"])
                     for log in mode_dir.glob("*/cpu*/iter-1.txt")})
    assert maps[0] == maps[1] == {("cpu0", 0), ("cpu1", 1), ("cpu2", 2)}


@ROOT_ONLY
@pytest.mark.parametrize("mode", ["esync", "sync"])
def test_capped_workers_train_with_the_same_arithmetic(tmp_path, mode):
    """Under CPU caps each worker's Python runs outside the cap and its operators under it (as
    its log says); the models are still exactly the rule's: ESync's rounds of two local steps
    and SSGD's steps, replayed in-process on the same batches."""
    _controller_or_skip()
    from support import write_fashion_dir
    from test_distributed import (BATCH, LR, ORIGINAL_MEAN, SEED, STEPS, assert_same_model,
                                  final_checkpoint, original_esync, original_sync, replicas)
    data = write_fashion_dir(tmp_path / "data", train_per_class=40, test_per_class=20)
    rule = (["-ll", LR, "--local-iters", 2, "-gl", 1, *ORIGINAL_MEAN] if mode == "esync"
            else ["-l", LR])
    run_cluster(tmp_path / "logs", data, "-m", mode, *rule, "--workers", 2, "--slowdown", "1,2",
                "--emulation", "cpu-cap", "--cpu-share", "0.4", "-b", BATCH,
                "--max-rounds", STEPS, "-e", 1, "--max-seconds", 0, "--seed", SEED,
                "--no-evaluator")
    mode_dir = tmp_path / "logs" / "lenet" / mode
    for device in ("cpu0", "cpu1"):
        log = (mode_dir / "processes" / f"worker-{device}.log").read_text()
        assert "training under the CPU cap" in log, log
        if "(every thread)" not in log:                # cgroup v2: nothing runs outside
            assert "Python and communication at the host's speed" in log, log
    want = (original_esync(replicas(data), rounds=STEPS, local_iters=2, local_lr=LR)
            if mode == "esync" else original_sync(replicas(data)))
    assert_same_model(final_checkpoint(mode_dir), want)


@ROOT_ONLY
def test_every_devices_clock_has_one_zero_however_long_its_warm_up(tmp_path, fashion_data_dir):
    """The training clock starts when the workers leave the store's init barrier, before the
    warm-up step. A x128 device capped at 1/320 core takes over a second for its warm-up probe
    while the x1 device trains; it then sits out (ready at once each round, then the exchange),
    so its rounds end when the x1 device's do, and on one clock their logs agree. Bounded by
    rounds, not seconds: a loaded machine (CI) stretched the warm-up to most of a 10 s run,
    which then logged one round. (On the
    clock the warm-up used to start, its times came a probe's length early: as rank 0 it put
    the checkpoints, and so the time to a target, that much early.)"""
    _controller_or_skip()
    from esync.common.esync_parts import PROBE_DIVISOR
    run_cluster(tmp_path / "logs", fashion_data_dir, "-m", "esync", "--workers", 2,
                "--slowdown", "1,128", "--emulation", "cpu-cap", "--cpu-share", "0.4",
                "-b", 64, "--max-rounds", 12, "--max-seconds", 0, "--no-evaluator", timeout=240)
    mode_dir = tmp_path / "logs" / "lenet" / "esync"
    ends = {}
    for device in ("cpu0", "cpu1"):
        records = [json.loads(p.read_text()) for p in (mode_dir / "vm" / device).glob("iter-*.txt")]
        ends[device] = {r["num_iters"]: r for r in records}
    slow = ends["cpu1"]
    assert all(r["k"] == 0 for r in slow.values()), "the x128 device should sit out"
    probe_s = slow[1]["iteration_time"] / PROBE_DIVISOR     # its warm-up, timed unscaled
    assert probe_s > 1.0, f"the x128 warm-up took {probe_s:.2f} s: too short to tell the clocks"
    common = sorted(set(ends["cpu0"]) & set(slow))[1:]
    assert len(common) >= 5, common
    gaps = sorted(abs(ends["cpu0"][n]["total_time"] - slow[n]["total_time"]) for n in common)
    assert gaps[len(gaps) // 2] < probe_s / 4, (probe_s, gaps)


@ROOT_ONLY
def test_a_x16_device_under_a_cap_probes_16_times_slower_and_takes_part(tmp_path, fashion_data_dir):
    """The sweep's caps (0.3 core a x1 device): a warm-up probe is a few milliseconds of CPU,
    so its wall time read CFS's burst (a x1 probe running inside one period's quota) or the
    rounding of a tiny cap's work to whole 53 ms periods; on the sweep's 16:1 cluster the x16
    devices' probes read 32-38 times the x1 devices' and they sat out for good (one of two
    runs); on this 1,16 pair the wall times read 22-28x. Timed at the cap's rate they read
    19.5-24x (a throttled device's cold caches cost it some CPU), well under the ratio 32, and
    the x16 device computes."""
    _controller_or_skip()
    run_cluster(tmp_path / "logs", fashion_data_dir, "-m", "esync", "--workers", 2,
                "--slowdown", "1,16", "--emulation", "cpu-cap", "--cpu-share", "0.3",
                "-b", 64, "--max-rounds", 5, "--max-seconds", 0, "--no-evaluator", timeout=240)
    mode_dir = tmp_path / "logs" / "lenet" / "esync"
    out = "".join(p.read_text() for p in (mode_dir / "processes").glob("*"))
    probes = {int(rank): float(s) for rank, s in
              re.findall(r"\[rank (\d) \S+\] training .*; warm-up (\S+) s a batch", out)}
    assert len(probes) == 2, out[-2000:]
    assert 10 < max(probes.values()) / min(probes.values()) < 27, probes
    slow = [json.loads(p.read_text()) for p in (mode_dir / "vm" / "cpu1").glob("iter-*.txt")]
    assert sum(r["num_samples"] for r in slow if r["num_iters"] > 1) > 0
