"""Emulated hosts on one machine: a network namespace per host, one bridge, shaped links.

    topo = Topology([EmulatedHost("ps", rate="100mbit"), EmulatedHost("host0", rate="20mbit")])
    topo.create()                        # clears what dead launchers left, then builds
    subprocess.Popen(topo.exec_prefix("host0") + ["python", "main.py", ...])
    topo.remove()                        # also on Ctrl-C, SIGTERM and crashes (the caller's job)

Layout (one topology per launcher):

    esy<pid>-sw       a namespace holding only the bridge `br0` and one port per host
    esy<pid>-<host>   a namespace per host: `lo` and `eth0` (a veth whose peer is the host's
                      port on the bridge), one address on a private /24, egress shaped with tc
                      `tbf` when the host has a rate (so what a host sends shares one link),
                      and /etc/netns/<namespace>/hosts: this machine's name resolves to the
                      host's address inside it

Nothing is added to this machine's own namespace (no interface, address or route; only the
hosts files under /etc/netns, removed with their namespaces), so traffic
between emulated hosts can never leave the machine and the subnet cannot clash with a real one
(it is still picked outside every route this machine has, to keep `ip` output unambiguous).
`netem` is missing on the kernels we target, so links have a rate but no added latency.

Every name carries the owner's pid. A launcher killed with SIGKILL cannot clean up; the next
`create()` (or ``python -m esync.emulation.namespaces clean``) removes the namespaces of owners
that are gone, and never those of a live process: other runs on the machine keep theirs.
"""
from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from esync.common.errors import UsageError
from esync.common.procs import process_start_time

PREFIX = "esy"
SWITCH = "sw"                     # the bridge's namespace suffix (not a valid host name)
BRIDGE = "br0"
HOST_IFACE = "eth0"
OWNERS_DIR = Path("/run/esync-netns")      # one small JSON per live topology: pid + start time
ETC_NETNS = Path("/etc/netns")             # per-namespace files `ip netns exec` mounts over /etc
SUBNET_CANDIDATES = ("198.18.0.0/24", "198.19.0.0/24", "10.213.0.0/24", "172.31.213.0/24")
NAME_RE = re.compile(rf"^{PREFIX}(\d+)(?:\.(\d+))?-([A-Za-z0-9_]+)$")
HOST_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,11}$")     # fits the 15-char interface limit
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$",
                     re.IGNORECASE)
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
              "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9,
              "tbps": 8 * 10**12}

_instances = itertools.count()


class NetnsError(Exception):
    """Building or removing an emulated topology failed (an `ip` or `tc` command said why)."""


class NetnsUnavailable(NetnsError, UsageError):
    """This machine cannot host emulated hosts at all: not root, or iproute2 missing."""


def parse_rate(text: str) -> int:
    """A tc-style rate ('20mbit', '1gbit', '500kbit', '10mbps' = bytes) in bits per second."""
    match = RATE_RE.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a rate; write a number and a unit, e.g. 20mbit, "
                         "1gbit, 500kbit (or bytes: 10mbps)")
    bits = float(match.group(1)) * RATE_UNITS[match.group(2).lower()]
    if bits < 8000:
        raise ValueError(f"{text!r} is below 8kbit, too slow to carry a TCP handshake")
    return int(bits)


def check_available() -> None:
    """Raise NetnsUnavailable with one line saying what is missing (root, `ip`, `tc`)."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("--net netns needs root (network namespaces and tc); run as "
                               "root or use --net loopback")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NetnsUnavailable(f"--net netns needs the `{tool}` command: install "
                                   "iproute2 (apt-get install iproute2) or use --net loopback")


@dataclass(frozen=True)
class EmulatedHost:
    name: str
    rate: str | None = None          # egress rate (tc syntax), None: unshaped


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def _start_time(pid: int) -> str | None:
    """``process_start_time`` as the owner records keep it (a string)."""
    start = process_start_time(pid)
    return None if start is None else str(start)


def namespaces() -> list[str]:
    """Names of every network namespace on the machine (ours and everybody else's)."""
    done = _run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _owner_alive(tag: str, pid: int) -> bool:
    start = _start_time(pid)
    if start is None:
        return False
    try:
        record = json.loads((OWNERS_DIR / f"{tag}.json").read_text())
    except (OSError, ValueError):
        return True                    # no record: the pid alone decides (err on keeping)
    return record.get("start") == start


def _kill_inside(namespace: str) -> None:
    """SIGKILL whatever still runs inside one of our namespaces (orphans of a dead launcher)."""
    done = _run("ip", "netns", "pids", namespace, check=False)
    for word in done.stdout.split():
        try:
            os.kill(int(word), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def _delete(namespace: str) -> None:
    _kill_inside(namespace)
    done = _run("ip", "netns", "delete", namespace, check=False)
    if done.returncode != 0 and namespace in namespaces():
        raise NetnsError(f"could not delete namespace {namespace}: {done.stderr.strip()}")
    shutil.rmtree(ETC_NETNS / namespace, ignore_errors=True)


def _write_hosts_file(namespace: str, address: str, host: str) -> None:
    """Inside the namespace this machine's name (and the host's) resolve to its own address.

    ``ip netns exec`` mounts ``/etc/netns/<namespace>/hosts`` over ``/etc/hosts``. Without it
    the machine's name resolves to loopback in every emulated host, and a program that binds
    to what its host name resolves to (Gloo, for Horovod's process sets) announces 127.0.0.1
    to the others."""
    folder = ETC_NETNS / namespace
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text(f"127.0.0.1\tlocalhost\n{address}\t{socket.gethostname()} "
                                  f"{host}\n::1\tlocalhost ip6-localhost ip6-loopback\n")


def remove_stale() -> list[str]:
    """Delete namespaces of topologies whose owner process is gone; returns their names.

    The bridge namespace goes last, so a half-removed topology is still found next time.
    """
    removed = []
    stale_tags = set()
    for name in sorted(namespaces(), key=lambda n: n.endswith(f"-{SWITCH}")):
        match = NAME_RE.match(name)
        if not match:
            continue
        tag = name.rsplit("-", 1)[0]
        if tag in stale_tags or not _owner_alive(tag, int(match.group(1))):
            stale_tags.add(tag)
            try:
                _delete(name)
            except NetnsError:
                continue           # someone else removed it a moment ago, or it is busy
            removed.append(name)
    for tag in stale_tags:
        (OWNERS_DIR / f"{tag}.json").unlink(missing_ok=True)
    for record in OWNERS_DIR.glob(f"{PREFIX}*.json"):     # owners killed before any namespace
        match = NAME_RE.match(f"{record.stem}-x")
        if match and not _owner_alive(record.stem, int(match.group(1))):
            record.unlink(missing_ok=True)
    return removed


def _routed_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine routes or owns an address in (default route excluded)."""
    nets = []
    for command in (("ip", "-4", "-o", "route", "show", "table", "all"), ("ip", "-4", "-o", "addr")):
        for line in _run(*command, check=False).stdout.splitlines():
            for word in line.split():
                try:
                    net = ipaddress.ip_network(word, strict=False)
                except ValueError:
                    continue
                if net.prefixlen > 0 and net.version == 4:
                    nets.append(net)
    return nets


def pick_subnet(routed: list[ipaddress.IPv4Network] | None = None) -> ipaddress.IPv4Network:
    """The first candidate /24 that overlaps nothing this machine routes."""
    routed = _routed_networks() if routed is None else routed
    for text in SUBNET_CANDIDATES:
        candidate = ipaddress.ip_network(text)
        if not any(candidate.overlaps(net) for net in routed):
            return candidate
    raise NetnsError(f"every candidate subnet ({', '.join(SUBNET_CANDIDATES)}) overlaps a route "
                     "of this machine")


def tbf_args(rate: str) -> list[str]:
    """tc arguments of a token bucket at `rate`: bursts of 10 ms (at least 32 KiB), 200 ms queue."""
    bits = parse_rate(rate)
    burst = max(32 * 1024, bits // 8 // 100)
    return ["tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", "200ms"]


class Topology:
    """One bridge and one namespace per host; create() builds it, remove() tears it down."""

    def __init__(self, hosts: list[EmulatedHost], *, owner_pid: int | None = None):
        names = [h.name for h in hosts]
        for name in names:
            if not HOST_RE.match(name) or name == SWITCH:
                raise ValueError(f"host name {name!r}: letters, digits and _ (at most 12, "
                                 f"starting with a letter; not {SWITCH!r})")
        if len(set(names)) != len(names):
            raise ValueError(f"host names repeat: {names}")
        if len(hosts) > 250:
            raise ValueError("at most 250 hosts fit the /24 subnet")
        self.hosts = list(hosts)
        self.owner_pid = owner_pid or os.getpid()
        instance = next(_instances)
        self.tag = f"{PREFIX}{self.owner_pid}" + (f".{instance}" if instance else "")
        self.subnet: ipaddress.IPv4Network | None = None
        self.created: list[str] = []

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def address(self, host: str) -> str:
        index = [h.name for h in self.hosts].index(host)
        return str(self.subnet.network_address + 1 + index)

    def exec_prefix(self, host: str) -> list[str]:
        """Prefix of a command line that runs in `host`'s namespace (same pid: `ip` execs)."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def create(self) -> "Topology":
        check_available()
        remove_stale()
        self.subnet = pick_subnet()
        OWNERS_DIR.mkdir(parents=True, exist_ok=True)
        (OWNERS_DIR / f"{self.tag}.json").write_text(json.dumps(
            {"pid": self.owner_pid, "start": _start_time(self.owner_pid)}))
        try:
            self._build()
        except BaseException:
            self.remove()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self.created.append(name)
        _run("ip", "-n", name, "link", "set", "dev", "lo", "up")

    def _build(self) -> None:
        switch = self.namespace(SWITCH)
        self._add_namespace(switch)
        _run("ip", "-n", switch, "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "-n", switch, "link", "set", "dev", BRIDGE, "up")
        for host in self.hosts:
            ns = self.namespace(host.name)
            self._add_namespace(ns)
            _run("ip", "-n", ns, "link", "add", HOST_IFACE, "type", "veth",
                 "peer", "name", host.name, "netns", switch)
            _run("ip", "-n", switch, "link", "set", "dev", host.name, "master", BRIDGE, "up")
            _run("ip", "-n", ns, "addr", "add",
                 f"{self.address(host.name)}/{self.subnet.prefixlen}", "dev", HOST_IFACE)
            _run("ip", "-n", ns, "link", "set", "dev", HOST_IFACE, "up")
            _write_hosts_file(ns, self.address(host.name), host.name)
            if host.rate:
                _run("tc", "-n", ns, "qdisc", "add", "dev", HOST_IFACE, "root",
                     *tbf_args(host.rate))

    def remove(self) -> None:
        """Delete every namespace (their veths, bridge and qdiscs go with them); idempotent."""
        errors = []
        for name in reversed(self.created):       # hosts first, the bridge last
            try:
                _delete(name)
            except NetnsError as exc:
                errors.append(str(exc))
        self.created = []
        (OWNERS_DIR / f"{self.tag}.json").unlink(missing_ok=True)
        if errors:
            raise NetnsError("; ".join(errors))

    def link_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each host's link has sent and received so far (its eth0's counters)."""
        found = {}
        for host in self.hosts:
            done = _run("ip", "-n", self.namespace(host.name), "-s", "-j", "link", "show",
                        "dev", HOST_IFACE, check=False)
            try:
                stats = json.loads(done.stdout)[0]["stats64"]
            except (ValueError, LookupError, TypeError):
                continue
            found[host.name] = {"sent": int(stats["tx"]["bytes"]),
                                "received": int(stats["rx"]["bytes"])}
        return found

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.remove()

    def describe(self) -> str:
        return ", ".join(f"{h.name}={self.address(h.name)}" + (f" ({h.rate})" if h.rate else "")
                         for h in self.hosts)


CLONE_NEWNET = 0x40000000


def call_in(namespace: str, fn, *args, timeout: float | None = None):
    """Run ``fn(*args)`` in a new thread that lives in `namespace`'s network; return its result.

    Sockets ``fn`` opens belong to that namespace (e.g. an HTTP health check of a server on an
    emulated host, from the launcher). Only that thread moves: setns(CLONE_NEWNET) acts on the
    calling thread, so the rest of the process stays where it was.
    """
    import ctypes
    import threading
    outcome = {}

    def body():
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise NetnsError(f"setns into {namespace}: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
            outcome["value"] = fn(*args)
        except BaseException as exc:          # re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=body, name=f"netns {namespace}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"call in namespace {namespace} took longer than {timeout} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class PortForward:
    """``127.0.0.1:<free port>`` on this machine, relayed to ``address:port`` in a namespace.

    The launcher's own network has no route into the emulated one (by design), so a page served
    on an emulated host (the state server's dashboard) is reached through this relay. Each
    connection gets a socket opened inside the namespace and two threads copying bytes.
    """

    def __init__(self, namespace: str, address: str, port: int):
        self.namespace, self.target = namespace, (address, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.local = self.listener.getsockname()[:2]
        threading.Thread(target=self._accept, name=f"forward {namespace}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:                   # closed
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = call_in(self.namespace, socket.create_connection, self.target, 10,
                               timeout=15)
        except (OSError, TimeoutError, NetnsError):
            client.close()
            return
        threading.Thread(target=_copy, args=(upstream, client), daemon=True).start()
        _copy(client, upstream)

    def close(self) -> None:
        self.listener.close()


def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        sink.close()
        source.close()


def main(argv=None) -> int:
    """``python -m esync.emulation.namespaces list|clean``: show ours, or remove what dead
    launchers left."""
    parser = argparse.ArgumentParser(prog="python -m esync.emulation.namespaces",
                                     description=main.__doc__)
    parser.add_argument("action", choices=["list", "clean"])
    args = parser.parse_args(argv)
    try:
        check_available()
    except NetnsError as exc:
        print(f"esync.emulation.namespaces: error: {exc}", file=sys.stderr)
        return 2
    if args.action == "clean":
        for name in remove_stale():
            print(f"removed {name}")
        return 0
    for name in namespaces():
        match = NAME_RE.match(name)
        if match:
            alive = _owner_alive(name.rsplit("-", 1)[0], int(match.group(1)))
            print(f"{name}\towner pid {match.group(1)} {'running' if alive else 'gone'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
