"""What one exchange costs against one iteration of the slowest device, found before start.

ESync's rules for the exchange (full deltas in rounds of one slowest iteration, or rank-32
factors in rounds stretched to an exchange share) pay off by how long moving the model takes
against the compute it interrupts, not by the kind of link: a shaped 200 Mbit link and a free
loopback want the same rule for lenet, a 20 Mbit one another. So the presets select by

    ratio = exchange seconds / seconds of one iteration of the slowest device

where the exchange moves the model once to and from every worker: each worker host's link
carries its workers' pushes, the parameter server's link every worker's pull. The launcher finds
both terms before anything starts and without contacting any host:

- links: the rates it shapes (``--net netns --bandwidth/--server-bandwidth``); loopback has no
  rate, so the exchange is a copy through memory (ratio 0);
- the model's bytes and one x1 iteration: measured here by the probe the benchmark uses
  (``esync.emulation.shaping.measure_in_subprocess``: a worker's process, one compute thread),
  divided by a x1 device's share of a core when the devices are emulated by CPU caps and times
  the slowest device's factor.

Other machines' links (``--backend ssh|slurm|kubernetes``) are not measured before their hosts
start: the ratio stays unknown and the presets treat the exchange as costly, as they say.
"""
from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

from esync.common.argtypes import slowdown_factors
from esync.emulation import cgroups, shaping, standalone_cap
from esync.emulation.hosts import PS_HOST, layout_from_args
from esync.launch.resources import emulates_devices


@dataclass(frozen=True)
class ExchangeCost:
    """The ratio the presets read (None: not known before start) and how it was found."""
    ratio: float | None
    basis: str
    exchange_s: float | None = None
    slowest_iteration_s: float | None = None


PROBE_ITERATIONS = 10    # the fastest of 10 is the device's speed; the probe stays short


@functools.lru_cache(maxsize=8)
def _probe(network: str, batch_size: int) -> tuple[int, float]:
    """(model bytes, seconds of one iteration on a free core): one probe per network and batch
    per process (a benchmark or a test resolves many runs of one network). The fastest of the
    probe's iterations, not their median: what the device computes at, where other work may
    share this machine while it is measured."""
    with _weighted_group() as prefix:
        found = shaping.measure_in_subprocess(network, batch_size, timed=PROBE_ITERATIONS,
                                              prefix=prefix)
    return int(found["model_bytes"]), float(found["fastest_s"])


@contextlib.contextmanager
def _weighted_group():
    """An argv prefix that runs the probe in an uncapped cgroup weighing as much as the
    launcher's workers (``cgroups.DEFAULT_WEIGHT`` ordinary processes), so that other work on a
    busy machine slows it no more than it will slow them; no prefix where cgroups are out of
    reach (not root)."""
    controller = cgroups.find_cpu_controller()
    if isinstance(controller, str):
        yield []
        return
    caps = cgroups.CpuCaps(controller)              # the kernel's CFS slice left as it is
    try:
        caps.cap("probe", None)
        yield caps.exec_prefix("probe")
    finally:
        caps.close()


def link_seconds(model_bytes: int, worker_hosts, rates: dict) -> float | None:
    """Seconds to move the model once to and from every worker over the shaped links: the
    busiest link decides (a worker host's link carries each of its workers' pushes, the
    server's every worker's pull). None when no link has a rate."""
    times = []
    server_rate = rates.get(PS_HOST)
    if server_rate:
        times.append(len(worker_hosts) * 8 * model_bytes / shaping.rate_bit_s(server_rate))
    for host in set(worker_hosts):
        if rates.get(host):
            workers = sum(1 for h in worker_hosts if h == host)
            times.append(workers * 8 * model_bytes / shaping.rate_bit_s(rates[host]))
    return max(times) if times else None


def x1_share(values, factors: list[float]) -> float:
    """A x1 device's share of a core: its CPU cap where the launcher will cap (root, cgroups,
    slow devices to emulate), else a whole core (sleeping emulation or real devices)."""
    if values["emulation"] == "sleep" or not emulates_devices(factors,
                                                              emulation=values["emulation"]):
        return 1.0
    if values.get("cpu_share"):
        return float(values["cpu_share"])
    if standalone_cap.cgroups_unavailable():
        return 1.0                               # the launcher will sleep instead
    return cgroups.default_share(factors, cores=len(os.sched_getaffinity(0)))


def estimate(values, devices: list[str], *, probe=_probe) -> ExchangeCost:
    """The exchange cost of the run ``values`` describe (the first resolution's values) on
    ``devices`` (one per worker).
    ``probe(network, batch_size)`` returns (model bytes, free-core iteration seconds)."""
    if values["backend"] != "local":
        return ExchangeCost(None, f"other machines' links (--backend {values['backend']}): "
                                  "not measured before their hosts start")
    layout = layout_from_args(_Flags(values), values["workers"])
    if layout is None or not any(layout.rates.values()):
        return ExchangeCost(0.0, "no link rate: every process on this machine exchanges "
                                 "through memory")
    model_bytes, free_core_s = probe(values["network"], values["batch_size"])
    exchange_s = link_seconds(model_bytes, layout.worker_hosts, layout.rates)
    factors = slowdown_factors(values["slowdown_list"], values["workers"])
    cpu_factors = [f for d, f in zip(devices, factors) if d == "cpu"] or [1.0]
    share = x1_share(values, cpu_factors)
    slowest_s = free_core_s / share * max(cpu_factors)
    ratio = exchange_s / slowest_s
    return ExchangeCost(
        ratio, f"{values['network']} ({model_bytes / 1e6:.2f} MB) over the shaped links: "
               f"{exchange_s * 1000:.0f} ms an exchange; the slowest device's iteration "
               f"{slowest_s * 1000:.0f} ms ({free_core_s * 1000:.0f} ms measured on a free core"
               f"{f', / {share:.2f} of a core' if share != 1.0 else ''}"
               f" x {max(cpu_factors):g})", exchange_s, slowest_s)


class _Flags:
    """The few attributes ``layout_from_args`` reads, from a mapping of values."""

    def __init__(self, values):
        self.net, self.hosts = values["net"], values["hosts"]
        self.bandwidth, self.server_bandwidth = values["bandwidth"], values["server_bandwidth"]
