"""Helpers the tests share (plain functions; pytest fixtures live in conftest.py).

Tests import them with ``from support import ...``: a module of its own, because several
``conftest.py`` files exist and ``from conftest import`` would pick whichever came first.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


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


# Real clusters (state server, ps-lite scheduler/server, evaluator, workers) on loopback, started
# through the launcher exactly as a user would.


def run_cluster(log_dir, data_dir, *args, timeout=240, check=True, env=None):
    """Run ``python -m esync.launch`` to completion; returns the CompletedProcess."""
    command = [sys.executable, "-m", "esync.launch", "-ld", str(log_dir), "-dd", str(data_dir),
               "--quiet", *map(str, args)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
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
    """PIDs of live processes whose command line or environment names `folder` (a test's
    tmp_path): a cluster's processes, including the state server, whose database path is only in
    its environment."""
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
