"""Shared pytest fixtures; each block belongs to the part of the project named in its comment."""
from pathlib import Path

import numpy as np
import pytest


# data fixtures ---------------------------------------------------------------------------------
# Small, learnable stand-ins for Fashion-MNIST written as real IDX files (esync.data reads them).


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
    from esync.data import FASHION_FILES, write_idx

    folder = Path(data_dir) / "fashion-mnist"
    folder.mkdir(parents=True, exist_ok=True)
    for offset, (split, per_class) in enumerate((("train", train_per_class),
                                                  ("test", test_per_class))):
        images, labels = make_fashion_arrays(per_class, seed=seed + offset)
        image_name, label_name = FASHION_FILES[split]
        write_idx(folder / image_name, images)
        write_idx(folder / label_name, labels)
    return Path(data_dir)


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


# cluster fixtures ------------------------------------------------------------------------------
# Real clusters (state server, ps-lite scheduler/server, evaluator, workers) on loopback, started
# through the launcher exactly as a user would.
import json as _json
import os as _os
import subprocess as _subprocess
import sys as _sys

REPO = Path(__file__).resolve().parents[1]


def run_cluster(log_dir, data_dir, *args, timeout=240, check=True, env=None):
    """Run ``python -m esync.launch`` to completion; returns the CompletedProcess."""
    command = [_sys.executable, "-m", "esync.launch", "-ld", str(log_dir), "-dd", str(data_dir),
               "--quiet", *map(str, args)]
    done = _subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           env=dict(_os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    if check and done.returncode != 0:
        raise AssertionError(f"cluster failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
                             + _process_logs(log_dir))
    return done


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
        result[device.name] = [_json.loads(f.read_text()) for f in files]
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

# end of cluster fixtures -----------------------------------------------------------------------


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
