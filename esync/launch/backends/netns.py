"""Each emulated host in its own network namespace, with its own address and a shaped link.

Processes are local processes started through ``ip netns exec``, so they die with the launcher
like any local process; data and logs stay on the shared file system, each host's name being the
``<host>`` folder of its workers' logs. Which worker runs on which host, and each host's rate, is
``esync.emulation.hosts``; the topology (``esync.emulation.namespaces``) is removed by
``close()``, which the supervisor calls on every way out; what a SIGKILLed launcher left is
removed by the next run.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import esync.emulation.namespaces as netns
from esync.common.files import atomic_write_text
from esync.common.speeds import CPU_CGROUP_ENV
from esync.emulation.hosts import PS_HOST, Layout
from esync.launch.backends.local import LocalBackend
from esync.launch.roles import REPO, Host, Hosts, RoleSpec


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
