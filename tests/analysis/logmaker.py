"""Hand-made logs in the exact format of docs/ARCHITECTURE.md, with known numbers.

Every round of a device repeats the same phases, so the tests can recompute every figure from the
parameters below by hand. Layout: ``<root>/<network>/<mode_dir>/<host>/<device>/iter-<n>.txt``
plus ``evaluations.jsonl`` and ``run.json`` beside the host folders.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

NETWORK = "lenet"
BATCH = 16
# Share of a local iteration's computing seconds per phase (exact binary fractions).
PHASE_SHARES = {"get_batch": 0.125, "forward and backward": 0.625, "local update": 0.25}
READY = 0.0625          # esync: "check ready" per local iteration and before aggregating
RESET = 0.03125         # esync: "reset state server" per round
AGGREGATE = 0.25        # "global update" (esync) / "global aggregate" (sync, async) per round
PUSHED = 4_000_000      # bytes pushed per round and worker
PULLED = 6_000_000      # bytes pulled per round and worker
STATE_REQUESTS = 2      # esync: HTTP calls per round


@dataclass(frozen=True)
class Device:
    host: str
    device: str
    rank: int
    slowdown: float
    step: float         # computing seconds per local iteration, slow-down included
    k: int              # esync: local iterations per round


# 2 hosts x 2 devices; k chosen so that each esync round computes for 0.5 s on every device.
CLUSTER = (
    Device("alpha", "gpu0", rank=0, slowdown=1.0, step=0.125, k=4),
    Device("alpha", "cpu0", rank=1, slowdown=4.0, step=0.5, k=1),
    Device("beta", "gpu0", rank=2, slowdown=1.0, step=0.125, k=4),
    Device("beta", "cpu1", rank=3, slowdown=2.0, step=0.25, k=2),
)
STANDALONE = Device("alpha", "gpu0", rank=0, slowdown=1.0, step=0.125, k=1)
ROUNDS = {"esync": 3, "sync": 6, "async": 6, "dcasgd": 6, "local": 8}

# Evaluator records (round, total_time, accuracy): esync reaches 0.80 at 2 s, sync at 6 s,
# async at 4 s, dcasgd never.
EVALUATIONS = {
    "esync": [(1, 1.0, 0.5), (2, 2.0, 0.81), (3, 3.0, 0.86)],
    "sync": [(2, 2.0, 0.4), (4, 4.0, 0.7), (6, 6.0, 0.8), (8, 8.0, 0.84)],
    "async": [(2, 2.0, 0.6), (4, 4.0, 0.82), (6, 6.0, 0.83)],
    "dcasgd": [(2, 2.0, 0.3), (4, 4.0, 0.5)],
}
# Standalone SGD logs its accuracy in its device log (no evaluator), one value per iteration.
LOCAL_ACCURACIES = [0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.88]


def _phases(step: float) -> dict:
    return {phase: share * step for phase, share in PHASE_SHARES.items()}


def round_record(style: str, dev: Device, n: int, *, extras: bool, accuracy=None) -> dict:
    """The record of round ``n`` (from 1) of one device in the given mode style."""
    if style == "esync":
        time = {str(i): {"check ready": READY, **_phases(dev.step)} for i in range(dev.k)}
        time[str(dev.k)] = {"check ready": READY, "global update": AGGREGATE,
                            "reset state server": RESET}
        k, compute = dev.k, dev.k * dev.step
        wait = (dev.k + 1) * READY + AGGREGATE + RESET
    elif style in ("sync", "async"):
        phases = _phases(dev.step)
        time = {"0": {"get_batch": phases["get_batch"],
                      "forward and backward": phases["forward and backward"],
                      "global aggregate": AGGREGATE, "local update": phases["local update"]}}
        k, compute, wait = 1, dev.step, AGGREGATE
    elif style == "local":
        time = {"0": _phases(dev.step)}
        k, compute, wait = 1, dev.step, 0.0
    else:
        raise ValueError(style)
    record = {"num_iters": n, "time": time, "num_samples": k * BATCH,
              "total_time": n * (compute + wait)}
    if accuracy is not None:
        record["accuracy"] = accuracy
    if extras:
        distributed = style != "local"
        record.update({
            "k": k, "compute_time": compute,
            "slowdown_time": compute * (1 - 1 / dev.slowdown), "wait_time": wait,
            "bytes_pushed": PUSHED if distributed else 0,
            "bytes_pulled": PULLED if distributed else 0,
            "slowdown": dev.slowdown, "rank": dev.rank,
            "state_requests": STATE_REQUESTS if style == "esync" else 0})
    return record


def write_device(mode_dir: Path, style: str, dev: Device, rounds: int, *, extras: bool = True,
                 accuracies=None) -> Path:
    folder = Path(mode_dir) / dev.host / dev.device
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(1, rounds + 1):
        accuracy = None if accuracies is None else accuracies[n - 1]
        record = round_record(style, dev, n, extras=extras, accuracy=accuracy)
        (folder / f"iter-{n}.txt").write_text(json.dumps(record))
    return folder


def write_evaluations(mode_dir: Path, records) -> Path:
    path = Path(mode_dir) / "evaluations.jsonl"
    with path.open("w") as fp:
        for rnd, seconds, accuracy in records:
            fp.write(json.dumps({"round": rnd, "total_time": seconds, "accuracy": accuracy,
                                 "samples": rnd * BATCH * len(CLUSTER)}) + "\n")
    return path


def write_mode(root: Path, mode_dir_name: str, *, extras: bool = True, evaluator: bool = True,
               accuracy_shift: float = 0.0, network: str = NETWORK) -> Path:
    """One mode folder: the 4-device cluster (or the standalone device for ``local``)."""
    base = mode_dir_name.removesuffix("-niid")
    style = "sync" if base == "dcasgd" else base
    mode_dir = Path(root) / network / mode_dir_name
    rounds = ROUNDS[base]
    if base == "local":
        accs = [min(round(a + accuracy_shift, 6), 1.0) for a in LOCAL_ACCURACIES]
        write_device(mode_dir, "local", STANDALONE, rounds, extras=extras, accuracies=accs)
    else:
        for dev in CLUSTER:
            # Rank 0 also logs accuracies (lower than the evaluator's: the evaluator must win).
            accs = [0.1] * rounds if dev.rank == 0 else None
            write_device(mode_dir, style, dev, rounds, extras=extras, accuracies=accs)
        if evaluator:
            write_evaluations(mode_dir, [(r, t, min(round(a + accuracy_shift, 6), 1.0))
                                         for r, t, a in EVALUATIONS[base]])
    (mode_dir / "run.json").write_text(json.dumps({"mode": base, "network": network,
                                                   "batch_size": BATCH}))
    return mode_dir


def write_layout(root: Path, modes=("esync", "sync", "async", "local"), **kwargs) -> Path:
    """Every mode folder under ``<root>/<network>/``; returns the network folder."""
    for mode in modes:
        write_mode(root, mode, **kwargs)
    return Path(root) / kwargs.get("network", NETWORK)
