"""The shaped-link setting: a link rate whose compute-to-communication ratio matches a real
cluster, derived from this machine's own measurements.

Reference cluster (the kind ESync is for: a lab whose GPU machines share 1 GbE): ResNet-18
(11.7 M parameters, 46.8 MB in float32) trained on GPUs at about 60 ms of compute per iteration.
Moving the model once over 1 Gbit/s takes about 374 ms (46.8 MB x 8 / 1 Gbit/s, protocol
overhead ignored), and every worker's pulls leave the parameter server through its one link. So
one transfer of the model costs ``RATIO = 374 / 60 = 6.2`` iterations of compute.

Here the model is the benchmark's network (lenet by default) and one device computes an
iteration in ``t`` seconds (measured in a worker's process: one thread, the benchmark's batch
size, forward, backward and update, divided by the x1 device's share of a core when the cluster
runs under CPU caps: the emulated device, not the free core, is what the link is matched to).
The matching rate makes one transfer of the model's ``M`` bytes cost the same multiple of
``t``: ``rate = 8 M / (RATIO t)`` bit/s, for each worker host's link and for the server's link
(shared by every worker's pulls, as in the reference cluster). For lenet
(1.7 MB) at 20 ms per iteration that is about 110 Mbit/s.

The same reasoning for the same GPUs over 10 GbE (36 ms per transfer, ratio 0.6) gives about
1.15 Gbit/s for lenet here: a link that fast barely throttles anything lenet sends, so the
loopback setting already stands for that kind of cluster.

The measurement runs in a worker's process (``python -m esync.worker.iteration_time``, with
``OMP_NUM_THREADS=1`` like a worker): it builds the network with MXNet, which this module never
imports.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from esync.common.procs import REPO, python_env

REFERENCE = {"name": "ResNet-18 on GPUs in a lab on 1 GbE", "model_mb": 46.8, "link_gbit": 1.0,
             "transfer_ms": 374.0, "compute_ms": 60.0}
RATIO = REFERENCE["transfer_ms"] / REFERENCE["compute_ms"]


def measure_in_subprocess(network: str, batch_size: int, timeout: float = 600,
                          timed: int | None = None, prefix: list[str] = ()) -> dict:
    """The model's bytes and one iteration's seconds (``esync.worker.iteration_time``), measured
    in a worker-like process; ``timed``: how many iterations to time (its default if None);
    ``prefix``: an argv prefix to start it with (a cgroup's ``exec_prefix``)."""
    env = {**os.environ, **python_env(), "OMP_NUM_THREADS": "1",
           "MXNET_CPU_WORKER_NTHREADS": "1"}
    proc = subprocess.run([*prefix, sys.executable, "-m", "esync.worker.iteration_time", network,
                           str(batch_size), *([str(timed)] if timed else [])],
                          cwd=str(REPO), env=env, capture_output=True,
                          text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"measuring {network}'s compute time failed: "
                           f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    return json.loads(lines[-1])


def matching_rate_bit_s(model_bytes: int, compute_s: float, ratio: float = RATIO) -> float:
    """The link rate at which one transfer of the model takes ``ratio`` x one iteration."""
    return 8 * model_bytes / (ratio * compute_s)


def tc_rate(bit_s: float) -> str:
    """A tc rate string, in whole kbit when below 10 mbit, else whole mbit."""
    if bit_s < 10e6:
        return f"{max(1, round(bit_s / 1e3))}kbit"
    return f"{round(bit_s / 1e6)}mbit"


def rate_bit_s(text: str) -> float:
    """``"100mbit"`` -> 1e8 (tc's units: bit, kbit, mbit, gbit; bps = bytes/s)."""
    text = text.lower()
    units = {"tbit": 1e12, "gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0,
             "gbps": 8e9, "mbps": 8e6, "kbps": 8e3, "bps": 8.0}
    for unit, factor in units.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)


def x1_share(args) -> float | None:
    """The share of a core a x1 device computes with when the cluster runs under CPU caps;
    None when it will emulate by sleeping (a x1 worker then computes on a free core)."""
    if getattr(args, "emulation", "sleep") == "sleep":
        return None
    from esync.emulation.standalone_cap import standalone_share
    try:
        return standalone_share(args)
    except RuntimeError:
        return None


def derive(args) -> dict:
    """The rates of the shaped setting, and what they came from (for the report)."""
    found = {"reference": REFERENCE, "ratio": RATIO, "measured": None}
    if args.bandwidths is None or args.server_rate is None:
        found["measured"] = measure_in_subprocess(args.network, args.batch_size)
        # The cluster's x1 device is a CPU-capped worker: its iteration takes the free one's
        # time / its share of a core (without caps, the free one's).
        found["x1_share"] = x1_share(args)
        found["device_s"] = found["measured"]["compute_s"] / (found["x1_share"] or 1.0)
        bit_s = matching_rate_bit_s(found["measured"]["model_bytes"], found["device_s"])
        found["derived_bit_s"] = bit_s
        found["derived"] = tc_rate(bit_s)
    found["worker"] = args.bandwidths or [found["derived"]]
    found["server"] = args.server_rate or (args.bandwidths[0] if args.bandwidths
                                           else found["derived"])
    found["auto"] = args.bandwidths is None
    return found
