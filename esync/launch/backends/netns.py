"""Each emulated host in its own network namespace, with its own address and a shaped link.

    esync-cluster --net netns --workers 4 --bandwidth 20mbit --server-bandwidth 100mbit
    esync-cluster --net netns --workers 6 --hosts 3,3 --bandwidth 1gbit,100mbit

The scheduler, parameter server(s), state server and evaluator run on host ``ps``; workers on
``host0``, ``host1``... (one per worker unless ``--hosts`` groups devices, whose workers then
share their host's link). Processes are local processes started through ``ip netns exec``, so
they die with the launcher like any local process; data and logs stay on the shared file system,
each host's name being the ``<host>`` folder of its workers' logs. The topology (esync.launch.namespaces) is
removed by ``close()``, which the supervisor calls on every way out; what a SIGKILLed launcher
left is removed by the next run.
"""
from __future__ import annotations

import json
import os

from dataclasses import dataclass
from pathlib import Path

import esync.launch.namespaces as netns
from esync.common.errors import UsageError
from esync.common.files import atomic_write_text
from esync.common.speeds import CPU_CGROUP_ENV
from esync.launch.backends.local import LocalBackend
from esync.launch.roles import REPO, Host, Hosts, RoleSpec

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


class NetnsBackend(LocalBackend):
    """Local processes, each in its host's network namespace (``ip netns exec`` keeps the pid,
    so process groups and the die-with-the-launcher signal work as for local processes)."""

    def __init__(self, layout: Layout, cwd: Path = REPO, base_env: dict | None = None,
                 caps=None, links_file: Path | None = None):
        super().__init__(cwd, base_env, caps)
        self.layout = layout
        self.links_file = links_file      # where close() records the bytes of every link
        self.topology = netns.Topology(layout.hosts)
        self.relays: list[netns.PortForward] = []

    def create(self) -> "NetnsBackend":
        """Build the topology (first clearing what dead launchers left); NetnsError if we can't."""
        self.topology.create()
        return self

    def placement(self) -> Hosts:
        """Addresses of the emulated hosts for the role plan (ps-lite uses each host's eth0)."""
        def host(name):
            return Host(name, self.topology.address(name), netns.HOST_IFACE)
        return Hosts(ps=host(PS_HOST), workers=tuple(host(n) for n in self.layout.worker_hosts))

    def command(self, spec: RoleSpec) -> list[str]:
        return self.topology.exec_prefix(spec.host) + list(spec.argv)

    def cap_environment(self, spec: RoleSpec) -> dict[str, str]:
        """``ip netns exec`` remounts /sys, hiding the cgroup hierarchy from the worker: it
        reaches its group through this launcher's root (``/proc/<pid>/root``), which lives as
        long as the job does (the workers die with the launcher)."""
        env = super().cap_environment(spec)
        if CPU_CGROUP_ENV in env:
            env[CPU_CGROUP_ENV] = f"/proc/{os.getpid()}/root{env[CPU_CGROUP_ENV]}"
        return env

    def run_on(self, host: str, fn, *args):
        """``fn(*args)`` in a thread inside `host`'s namespace: the launcher itself has no
        address on the emulated network, by design."""
        return netns.call_in(self.topology.namespace(host), fn, *args, timeout=120)

    def reachable(self, host: str, address: str, port: int) -> tuple[str, int]:
        """A relay on this machine's 127.0.0.1 into `host`'s namespace (closed with the rest)."""
        relay = netns.PortForward(self.topology.namespace(host), address, port)
        self.relays.append(relay)
        return relay.local

    def close(self) -> None:
        try:
            for relay in self.relays:
                relay.close()
            super().close()
            self._record_links()
        finally:
            self.topology.remove()

    def _record_links(self) -> None:
        """The bytes each host's link carried over the job, measured by the kernel (the
        workers' own counts say what they asked for, this what crossed the links)."""
        if self.links_file is None or not self.topology.created:
            return
        counts = self.topology.link_bytes()
        if counts:
            self.links_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.links_file, json.dumps(
                {"hosts": counts, "worker_hosts": list(self.layout.worker_hosts),
                 "ps_host": PS_HOST}, indent=1))
