"""Helpers the tests share (plain functions; pytest fixtures live in conftest.py).

Tests import them with ``from support import ...``: a module of its own, because several
``conftest.py`` files exist and ``from conftest import`` would pick whichever came first.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


# Small, learnable stand-ins for Fashion-MNIST written as real IDX files (esync.common.dataset
# reads them).

def make_fashion_arrays(per_class, seed=0):
    """(uint8 images [10*per_class, 28, 28], uint8 labels), classes shuffled together.

    Class c has a bright bar on rows 2c+2..2c+3 over dim noise, so a small CNN learns it fast.
    """
    rng = np.random.RandomState(seed)
    labels = np.repeat(np.arange(10, dtype=np.uint8), per_class)
    rng.shuffle(labels)
    images = rng.randint(0, 60, size=(len(labels), 28, 28)).astype(np.uint8)
    for c in range(10):
        images[labels == c, 2 * c + 2:2 * c + 4, 4:24] = 255
    return images, labels


def write_fashion_dir(data_dir, *, train_per_class=20, test_per_class=10, seed=0):
    """Write the four Fashion-MNIST IDX files in ``<data_dir>/fashion-mnist/``; return data_dir."""
    from esync.common.catalog import FASHION_FILES
    from esync.common.dataset import write_idx

    folder = Path(data_dir) / "fashion-mnist"
    folder.mkdir(parents=True, exist_ok=True)
    for offset, (split, per_class) in enumerate((("train", train_per_class),
                                                  ("test", test_per_class))):
        images, labels = make_fashion_arrays(per_class, seed=seed + offset)
        image_name, label_name = FASHION_FILES[split]
        write_idx(folder / image_name, images)
        write_idx(folder / label_name, labels)
    return Path(data_dir)


# Real clusters (state server, ps-lite scheduler/server, evaluator, workers) on loopback, started
# through the launcher exactly as a user would.


def run_cluster(log_dir, data_dir, *args, timeout=240, check=True, env=None):
    """Run ``python -m esync.launch`` to completion; returns the CompletedProcess. Whatever
    happens (timeout, failure), none of its processes outlive the call."""
    launchers = Launchers(log_dir)
    try:
        return launchers.run("-ld", log_dir, "-dd", data_dir, "--quiet", *args, timeout=timeout,
                             check=check, env=env)
    finally:
        launchers.remove_all()


def copy_of_finished_run(finished, tmp_path):
    """(data_dir, a copy of a finished run's log folder at ``tmp_path / "logs"``) from
    ``finished`` = (data_dir, log_dir): tests that change or extend earlier logs each start from
    their own copy, so their module trains the run once."""
    import shutil
    data_dir, log_dir = finished
    return data_dir, Path(shutil.copytree(log_dir, tmp_path / "logs"))


class Launchers:
    """Starts ``python -m esync.launch`` processes for one test and removes them all afterwards.

    ``launchers(*argv, env=None, cwd=REPO) -> Popen`` (text pipes, its own process group);
    ``launchers.run(*argv, timeout=240, check=True, ...) -> CompletedProcess`` runs one to its end.
    """

    def __init__(self, folder):
        self.folder, self.started = folder, []

    def __call__(self, *argv, env=None, cwd=None):
        # The tag is inherited by every process the launcher starts (scheduler and servers name
        # no folder on their command line), so `processes_of(folder)` finds them all. The
        # launcher dies with pytest (and its cluster with it) even if pytest is SIGKILLed.
        from esync.common.procs import die_with_parent
        proc = subprocess.Popen([sys.executable, "-m", "esync.launch", *map(str, argv)],
                                cwd=cwd or REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, preexec_fn=die_with_parent,
                                env=dict(os.environ, PYTHONUNBUFFERED="1",
                                         ESYNC_TEST_FOLDER=str(self.folder), **(env or {})))
        self.started.append(proc)
        return proc

    def run(self, *argv, timeout=240, check=True, env=None, cwd=None):
        proc = self(*argv, env=env, cwd=cwd)
        out, err = proc.communicate(timeout=timeout)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and done.returncode != 0:
            raise AssertionError(f"cluster failed ({done.returncode}):\n{out}\n{err}"
                                 + _process_logs(self.folder))
        return done

    def remove_all(self):
        """SIGTERM to a launcher still running (it stops its cluster), SIGKILL to its group after
        20 s (its children die with it), then SIGKILL to any process naming the folder."""
        from esync.common.procs import kill_group
        for proc in self.started:
            if proc.poll() is None:
                kill_group(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    kill_group(proc, signal.SIGKILL)
                    proc.wait()
            for stream in (proc.stdout, proc.stderr):
                stream.close()
        kill_processes_of(self.folder)


def _process_logs(log_dir):
    out = []
    for log in sorted(Path(log_dir).glob("*/*/processes/*.log")):
        out.append(f"\n--- {log.name} ---\n" + "\n".join(log.read_text().splitlines()[-15:]))
    return "".join(out)


def device_logs(mode_dir):
    """{device folder name: [log dicts in round order]} for every device under mode_dir."""
    result = {}
    for device in sorted(p for p in Path(mode_dir).glob("*/*") if p.is_dir()
                         and p.parent.name not in ("processes", "checkpoints")):
        files = sorted(device.glob("iter-*.txt"), key=lambda f: int(f.stem.split("-")[1]))
        result[device.name] = [json.loads(f.read_text()) for f in files]
    return result


def processes_mentioning(text):
    """PIDs of live processes whose command line contains `text` (to prove nothing is left)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((ln for ln in (entry / "status").read_text().splitlines()
                          if ln.startswith("State:")), "")
        except OSError:
            continue
        if text in cmdline and "zombie" not in state:
            pids.append(int(entry.name))
    return pids



def processes_of(folder):
    """PIDs of live processes whose command line or environment names `folder`: every process of
    a cluster that `Launchers` started for that folder (they inherit ESYNC_TEST_FOLDER)."""
    import re
    pattern = re.compile(re.escape(str(folder)).encode() + rb"(/|\0|\s|$)")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
            state = next((ln for ln in (entry / "status").read_text().splitlines()
                          if ln.startswith("State:")), "")
        except OSError:
            continue
        if pattern.search(text) and "zombie" not in state:
            pids.append(int(entry.name))
    return pids


def kill_processes_of(folder):
    """SIGKILL every live process ``processes_of(folder)`` finds (what a test's processes forked
    included)."""
    for pid in processes_of(folder):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for_rounds(launcher, mode_dir, rounds, timeout=180):
    """Until worker cpu1 of a running job has logged `rounds` rounds; fails if the launcher ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if launcher.poll() is not None:
            raise AssertionError(f"launcher ended early: {launcher.communicate()}")
        if len(list(mode_dir.glob("*/cpu1/iter-*.txt"))) >= rounds:
            return
        time.sleep(0.2)
    raise AssertionError(f"no round {rounds} within {timeout} s")


def _why_no_netns():
    """Why network-namespace tests cannot run here (not root, no iproute2), or None."""
    import esync.emulation.namespaces as netns
    try:
        netns.check_available()
    except netns.NetnsError as exc:
        return str(exc)
    return None


def needs_netns(test):
    """Skip `test`, saying why, where network namespaces are unavailable."""
    import pytest
    why = _why_no_netns()
    return pytest.mark.skipif(why is not None, reason=f"network namespaces unavailable: {why}")(test)


class FakeClock:
    """A clock the test moves by hand (the state server's rules read time through it)."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
