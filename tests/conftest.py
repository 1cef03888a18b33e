"""Shared pytest fixtures; each block belongs to the part of the project named in its comment.

Plain helper functions shared by tests live in ``support.py``.
"""
from pathlib import Path

import pytest

from support import write_fashion_dir


# process hygiene ---------------------------------------------------------------------------
# Whatever a test starts from pytest's main thread dies with pytest, even when pytest itself is
# killed (CI's time limit, Ctrl-C twice) and no fixture teardown runs: the kernel's parent-death
# signal does it. Tests that stop processes themselves are unaffected.


@pytest.fixture(autouse=True, scope="session")
def children_die_with_pytest():
    import subprocess
    import threading

    from esync.common.procs import die_with_parent

    original = subprocess.Popen.__init__

    def popen(self, *args, **kwargs):
        if kwargs.get("preexec_fn") is None and threading.current_thread() is threading.main_thread():
            kwargs["preexec_fn"] = die_with_parent
        original(self, *args, **kwargs)

    subprocess.Popen.__init__ = popen
    yield
    subprocess.Popen.__init__ = original


@pytest.fixture(autouse=True, scope="session")
def sigint_as_at_a_terminal():
    """Processes the tests start get SIGINT's default action, as at a terminal, even when pytest
    was started with SIGINT ignored (``nohup``, or ``cmd &`` in a script): ignored dispositions
    are inherited across exec, and the launcher deliberately keeps ignoring a SIGINT its parent
    ignored, so the Ctrl-C tests would wait for a launcher that cannot hear them. A handler, not
    SIG_IGN, in pytest resets to the default in every child."""
    import signal

    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, previous)

# end of process hygiene ------------------------------------------------------------------------


# data fixtures ---------------------------------------------------------------------------------
# Small, learnable stand-ins for Fashion-MNIST written as real IDX files (esync.common.dataset
# reads them).


@pytest.fixture
def fashion_data_dir(tmp_path):
    """A data_dir holding a small Fashion-MNIST stand-in: 200 train and 100 test images."""
    return write_fashion_dir(tmp_path / "data")


@pytest.fixture
def fashion_dir_factory(tmp_path):
    """``make(name="data", train_per_class=20, test_per_class=10, seed=0) -> data_dir``."""
    def make(name="data", **kwargs):
        return write_fashion_dir(tmp_path / name, **kwargs)

    return make

# end of data fixtures --------------------------------------------------------------------------


# foundation fixtures ---------------------------------------------------------------------------
# `python main.py` in a subprocess, and real Fashion-MNIST for the end-to-end training tests.

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_main_py(*argv, env=None, timeout=600):
    """Run ``python main.py ARGV`` from the repository root with one OpenMP thread.

    DMLC_* variables of the caller are dropped; `env` adds variables (DMLC_ROLE=... etc.).
    """
    import os
    import subprocess
    import sys

    from esync.common.procs import python_env

    full = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    full.update(python_env(), OMP_NUM_THREADS="1")
    full.update(env or {})
    return subprocess.run([sys.executable, "main.py", *map(str, argv)], cwd=REPO_ROOT, env=full,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def main_py():
    """``main_py(*argv, env=None, timeout=600) -> subprocess.CompletedProcess`` (text output)."""
    return run_main_py


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes several seconds (large input sizes); "
                                       "still run by default, deselect with -m 'not slow'")


@pytest.fixture(scope="session")
def real_fashion_dir():
    """``config.data_dir`` holding the real Fashion-MNIST set, prepared if needed (idempotent)."""
    import config
    from esync.worker.prepare import prepare

    prepare(config.data_dir, quiet=True)
    return Path(config.data_dir)


@pytest.fixture(scope="session")
def real_fashion_subset(real_fashion_dir, tmp_path_factory):
    """A data_dir with the first 3000 train and 1000 test images of the real Fashion-MNIST."""
    from esync.common.catalog import FASHION_FILES
    from esync.common.dataset import load_fashion_mnist, write_idx

    data_dir = tmp_path_factory.mktemp("real-fashion-subset")
    folder = data_dir / "fashion-mnist"
    folder.mkdir()
    for split, count in (("train", 3000), ("test", 1000)):
        images, labels = load_fashion_mnist(real_fashion_dir, split)
        image_name, label_name = FASHION_FILES[split]
        write_idx(folder / image_name, images[:count])
        write_idx(folder / label_name, labels[:count])
    return data_dir

# end of foundation fixtures --------------------------------------------------------------------


# launcher fixtures -----------------------------------------------------------------------------
# Every test that starts a launcher (or anything else that starts a cluster) goes through
# `launcher`, so a failing or timed-out test never leaves processes behind.


@pytest.fixture
def launcher(tmp_path):
    """Start launchers (see ``Launchers``); whether the test passes, fails or times out
    (pytest-timeout's default signal method runs teardown), none of their processes outlive it."""
    from support import Launchers
    launchers = Launchers(tmp_path)
    yield launchers
    launchers.remove_all()


# end of launcher fixtures ----------------------------------------------------------------------


# backends fixtures ------------------------------------------------------------------------------
# Real daemons the ssh and Slurm backends are tested against (see daemons.py); each is stopped by
# its process id when the test ends, whatever the outcome.


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """An sshd on 127.0.0.1 with key auth; ``sshd.ssh_config`` is the client's ``ssh -F`` file.

    One per test module (the tests of a module share it; each uses its own log folder)."""
    from daemons import Sshd, why_not_sshd

    reason = why_not_sshd()
    if reason:
        pytest.skip(reason)
    daemon = Sshd(tmp_path_factory.mktemp("sshd")).start()
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def slurm():
    """A single-node Slurm (munged, slurmctld, slurmd); ``slurm.env`` holds its SLURM_CONF.

    One per test module (starting Slurm takes seconds); each test submits its own jobs."""
    from daemons import SlurmCluster, why_not_slurm

    reason = why_not_slurm()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()

# end of backends fixtures -----------------------------------------------------------------------
