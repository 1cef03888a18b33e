"""A worker that fails mid-training exits at once, named, instead of waiting for its peers.

A real ps-lite job (scheduler, server, two sync workers) on loopback, started role by role as
the README describes. Mid-training, one worker's log folder is replaced by a plain file (as if
someone removed the run's folder), so its next round log cannot be written. Its peer is then
blocked in the next push_pull, waiting for it; the failed worker must still exit with a
non-zero code and its traceback, not sit in MXNet's exit barrier.
"""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from support import REPO

EXIT_WITHIN_S = 60      # generous for a loaded machine; the hang it guards against is endless


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def processes():
    """Start processes in their own groups; every group is killed when the test ends."""
    started = []

    def start(argv, env, log):
        out = open(log, "wb")
        proc = subprocess.Popen([sys.executable, "main.py", *map(str, argv)], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        out.close()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_worker_whose_log_folder_breaks_exits_at_once_with_its_traceback(
        tmp_path, fashion_data_dir, processes):
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    base.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1",
                DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_SERVER="1",
                DMLC_NUM_WORKER="2", DMLC_NODE_HOST="127.0.0.1")
    processes([], dict(base, DMLC_ROLE="scheduler"), tmp_path / "scheduler.log")
    processes([], dict(base, DMLC_ROLE="server"), tmp_path / "server.log")
    train = ["-m", "sync", "-c", 1, "-n", "lenet", "-b", 8, "-e", 10000, "-ld", tmp_path / "logs",
             "-dd", fashion_data_dir, "--max-rounds", 0, "--max-seconds", 0, "--host-name", "h"]
    workers = {name: processes(train + ["--device-name", name], dict(base, DMLC_ROLE="worker"),
                               tmp_path / f"{name}.log")
               for name in ("w0", "w1")}
    folder = tmp_path / "logs" / "lenet" / "sync" / "h" / "w1"
    _wait_for(lambda: (folder / "iter-3.txt").exists()
              or any(p.poll() is not None for p in workers.values()), 180, "three rounds")
    assert all(p.poll() is None for p in workers.values()), "a worker ended before the fault"

    folder.rename(folder.with_name("w1.removed"))
    folder.write_text("not a folder any more")

    _wait_for(lambda: workers["w1"].poll() is not None, EXIT_WITHIN_S,
              "the failed worker to exit (it hangs in MXNet's exit barrier without the fix)")
    log = (tmp_path / "w1.log").read_text(errors="replace")
    # A write between the rename and the new file finds no folder (FileNotFoundError); one
    # after it finds a file in its place (NotADirectoryError): either is the broken folder.
    assert (workers["w1"].returncode != 0 and "Traceback" in log
            and ("NotADirectoryError" in log or "FileNotFoundError" in log)), log[-3000:]
