"""The emulated hosts of ``--net netns``: which worker runs on which host, each host's link rate.

    esync-cluster --net netns --workers 4 --bandwidth 20mbit --server-bandwidth 100mbit
    esync-cluster --net netns --workers 6 --hosts 3,3 --bandwidth 1gbit,100mbit

The scheduler, parameter server(s), state server and evaluator run on host ``ps``; workers on
``host0``, ``host1``... (one per worker unless ``--hosts`` groups devices, whose workers then
share their host's link). This module reads the flags into a ``Layout``; the topology itself is
``esync.emulation.namespaces``, and the launcher's backend that starts processes in it is
``esync.launch.backends.netns``.
"""
from __future__ import annotations

from dataclasses import dataclass

import esync.emulation.namespaces as netns
from esync.common.errors import UsageError

PS_HOST = "ps"


def add_network_args(group) -> None:
    """--net, --hosts, --bandwidth, --server-bandwidth (an argparse group of esync-cluster)."""
    group.add_argument("--net", choices=["loopback", "netns"], default="loopback",
                       help="loopback: every process on this machine's loopback; netns: one "
                            "network namespace per emulated host on a bridge (needs root)")
    group.add_argument("--hosts", default=None, metavar="N[,N...]",
                       help="with --net netns: devices per worker host, e.g. 3,3; workers of a "
                            "host share its link; unset: one host per worker")
    group.add_argument("--bandwidth", default=None, metavar="RATE[,RATE...]",
                       help="with --net netns: egress rate of each worker host (tc units: "
                            "20mbit, 1gbit), one for all or one per host; unset: unshaped")
    group.add_argument("--server-bandwidth", default=None, metavar="RATE",
                       help="with --net netns: egress rate of the ps host (the pulls of every "
                            "worker share it); unset: unshaped")


@dataclass(frozen=True)
class Layout:
    """Which worker runs on which emulated host, and each host's egress rate."""
    worker_hosts: tuple[str, ...]          # host name of worker i
    rates: dict                            # host name -> rate text or None (ps included)

    @property
    def hosts(self) -> list[netns.EmulatedHost]:
        names = [PS_HOST] + sorted(set(self.worker_hosts), key=lambda n: int(n[4:]))
        return [netns.EmulatedHost(name, self.rates.get(name)) for name in names]


def layout_from_args(args, workers: int) -> Layout | None:
    """The emulated hosts of --net netns (None for loopback); bad flags raise UsageError."""
    if args.net != "netns":
        for flag in ("hosts", "bandwidth", "server_bandwidth"):
            if getattr(args, flag) is not None:
                raise UsageError(f"argument --{flag.replace('_', '-')}: needs --net netns")
        return None
    sizes = _host_sizes(args.hosts, workers)
    names = [f"host{i}" for i in range(len(sizes))]
    worker_hosts = tuple(name for name, size in zip(names, sizes) for _ in range(size))
    rates = {PS_HOST: _rate("--server-bandwidth", args.server_bandwidth)}
    given = [t.strip() for t in args.bandwidth.split(",")] if args.bandwidth else [None]
    if len(given) == 1:
        given *= len(names)
    if len(given) != len(names):
        raise UsageError(f"argument --bandwidth: {len(given)} rates for {len(names)} worker hosts "
                         "(give one per host, or one for all)")
    rates.update({name: _rate("--bandwidth", rate) for name, rate in zip(names, given)})
    return Layout(worker_hosts, rates)


def _host_sizes(text: str | None, workers: int) -> list[int]:
    if text is None:
        return [1] * workers
    try:
        sizes = [int(t) for t in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(s < 1 for s in sizes):
        raise UsageError(f"argument --hosts: {text!r} is not a comma-separated list of positive "
                         "device counts, e.g. 3,3")
    if sum(sizes) != workers:
        raise UsageError(f"argument --hosts: {text} places {sum(sizes)} devices, but there are "
                         f"{workers} workers; make them agree")
    return sizes


def _rate(flag: str, text: str | None) -> str | None:
    if text is None:
        return None
    try:
        netns.parse_rate(text)
    except ValueError as exc:
        raise UsageError(f"argument {flag}: {exc}") from None
    return text
