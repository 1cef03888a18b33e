"""Chaos: SIGKILL the state server at 10 random moments of one real ESync job; the job finishes
with every round logged.

A real 2-worker LeNet job through the launcher (ps-lite scheduler and server, the state server on
gunicorn, workers), which restarts a dead state server in place. Half of the kills wait until a
worker's request is in flight (bytes queued on one of the server's connections while it is
frozen with SIGSTOP), resume it for a random 0-2 ms so the kill lands while it reads, decides,
commits or answers, and SIGKILL it; the other half land at a random moment. The workers retry
whatever the kill does to their call (refused connection, reset, an answer cut short) and the
server's idempotent calls make the retries safe.
"""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from support import device_logs, write_fashion_dir

ROOT = Path(__file__).resolve().parents[2]

KILLS = 10
ROUNDS = 60
# Kills land in the first half of the job: each kill costs the test up to a few hundred ms of
# reaction (a random pause, the wait for a queued request) while the workers run on, and the job
# must still be running when the tenth kill comes.
LAST_KILL_ROUND = ROUNDS // 2
# The launcher restarts a dead state server at most STATE_SERVER_RESTARTS times per job (3 by
# default); this test needs more, so it raises the budget for its own launcher.
LAUNCHER = ("import sys, esync.launch.program as program; program.STATE_SERVER_RESTARTS = 50; "
            "sys.exit(program.main())")


def processes_of(folder: Path) -> list[int]:
    """PIDs whose command line or environment names ``folder`` (every process of the job)."""
    needle = str(folder).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes() or needle in (
                    entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _kill_group(pid: int) -> None:
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@pytest.fixture
def launcher_reaper(tmp_path):
    """Start the launcher in its own process group; kill it and every process of the job after
    the test, whether it passed, failed or timed out."""
    started = []

    def start(*args) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, *map(str, args)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        _kill_group(proc.pid)
    for pid in processes_of(tmp_path):
        _kill_group(pid)
    for proc in started:
        proc.wait(timeout=30)


def rounds_logged(mode_dir: Path, device: str) -> int:
    return len(list(mode_dir.glob(f"*/{device}/iter-*.txt")))


def state_server_pids(port: int) -> list[int]:
    marker = f"127.0.0.1:{port}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline and b"gunicorn" in cmdline:
                pids.append(int(entry.name))
    return pids


def state_port(folder: Path) -> int | None:
    for pid in processes_of(folder):
        try:
            argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--state-server-port" in argv:
            return int(argv[argv.index(b"--state-server-port") + 1])
    return None


def request_queued(port: int) -> bool:
    """Whether bytes wait unread on one of the server's established connections."""
    suffix = f":{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(suffix) and fields[3] == "01":
            if int(fields[4].split(":")[1], 16) > 0:
                return True
    return False


def wait_until(condition, timeout: float, launcher: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if launcher.poll() is not None:
            out, err = launcher.communicate()
            raise AssertionError(f"launcher ended while waiting for {what}: {err[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def server_answers(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/health/", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def kill_mid_request(pids: list[int], port: int, rng: random.Random) -> bool:
    """Freeze the server until a request is queued, let it run 0-2 ms, SIGKILL; queued or not."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 2.0
    queued = False
    while time.monotonic() < deadline and not (queued := request_queued(port)):
        time.sleep(0.002)
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    time.sleep(rng.uniform(0.0, 0.002))
    for pid in pids:
        _kill_group(pid)
    return queued


@pytest.mark.timeout(420)
def test_job_finishes_with_every_round_logged_when_the_state_server_is_killed_10_times(
        tmp_path, launcher_reaper):
    seed = int(os.environ.get("ESYNC_CHAOS_SEED") or int.from_bytes(os.urandom(4), "little"))
    rng = random.Random(seed)                 # a failure names its seed: ESYNC_CHAOS_SEED=...
    data_dir = write_fashion_dir(tmp_path / "data")
    launcher = launcher_reaper("-ld", tmp_path, "-dd", data_dir, "--quiet", "-m", "esync",
                               "--workers", 2, "--slowdown", "1,3", "-b", 32,
                               "--max-rounds", ROUNDS, "--max-seconds", 0, "--no-evaluator")
    mode_dir = tmp_path / "lenet" / "esync"
    kill_rounds = sorted(rng.sample(range(2, LAST_KILL_ROUND), KILLS))
    in_flight = 0
    for number, kill_round in enumerate(kill_rounds):
        wait_until(lambda: rounds_logged(mode_dir, "cpu0") >= kill_round, 180, launcher,
                   f"round {kill_round}")
        port = state_port(tmp_path)
        wait_until(lambda: server_answers(port), 120, launcher, "the restarted state server")
        time.sleep(rng.uniform(0.0, 0.3))
        pids = state_server_pids(port)
        if number % 2 == 0:
            in_flight += kill_mid_request(pids, port, rng)
        else:
            for pid in pids:
                _kill_group(pid)
    out, err = launcher.communicate(timeout=300)
    logs = device_logs(mode_dir)
    rounds = {device: [entry["num_iters"] for entry in entries] for device, entries in logs.items()}
    assert (launcher.returncode, in_flight >= 3, rounds) == (
        0, True, {"cpu0": list(range(1, ROUNDS + 1)), "cpu1": list(range(1, ROUNDS + 1))}), (
        f"seed {seed}, kills at rounds {kill_rounds}, {in_flight} with a request in flight\n"
        f"{err[-4000:]}")
