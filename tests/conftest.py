"""Shared pytest fixtures; each block belongs to the part of the project named in its comment.

Plain helper functions shared by tests live in ``support.py``.
"""
from pathlib import Path

import pytest

from support import write_fashion_dir


# data fixtures ---------------------------------------------------------------------------------
# Small, learnable stand-ins for Fashion-MNIST written as real IDX files (esync.data reads them).


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

    full = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    full.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
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
    from esync.prepare import prepare

    prepare(config.data_dir, quiet=True)
    return Path(config.data_dir)


@pytest.fixture(scope="session")
def real_fashion_subset(real_fashion_dir, tmp_path_factory):
    """A data_dir with the first 3000 train and 1000 test images of the real Fashion-MNIST."""
    from esync.data import FASHION_FILES, load_fashion_mnist, write_idx

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


class Launchers:
    """Starts ``python -m esync.launch`` processes for one test and removes them all afterwards.

    ``launchers(*argv, env=None, cwd=REPO) -> Popen`` (text pipes, its own process group);
    ``launchers.run(*argv, timeout=240, check=True, ...) -> CompletedProcess`` runs one to its end.
    """

    def __init__(self, folder):
        self.folder, self.started = folder, []

    def __call__(self, *argv, env=None, cwd=None):
        import os
        import subprocess
        import sys

        from support import REPO
        proc = subprocess.Popen([sys.executable, "-m", "esync.launch", *map(str, argv)],
                                cwd=cwd or REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
        self.started.append(proc)
        return proc

    def run(self, *argv, timeout=240, check=True, env=None, cwd=None):
        import subprocess

        from support import _process_logs
        proc = self(*argv, env=env, cwd=cwd)
        out, err = proc.communicate(timeout=timeout)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and done.returncode != 0:
            raise AssertionError(f"cluster failed ({done.returncode}):\n{out}\n{err}"
                                 + _process_logs(self.folder))
        return done

    def remove_all(self):
        """SIGTERM to a launcher still running (it stops its cluster), SIGKILL to its group after
        20 s (its children die with it), then SIGKILL to any process naming the test's folder (command line or environment)."""
        import os
        import signal
        import subprocess

        from esync.procs import kill_group
        from support import processes_of
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
        for pid in processes_of(self.folder):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def launcher(tmp_path):
    """Start launchers (see ``Launchers``); whether the test passes, fails or times out
    (pytest-timeout's default signal method runs teardown), none of their processes outlive it."""
    launchers = Launchers(tmp_path)
    yield launchers
    launchers.remove_all()


# end of launcher fixtures ----------------------------------------------------------------------
