"""Emulated hosts in network namespaces (esync.emulation.namespaces) and ps-lite's interface
choice (esync.common.netif).

The namespace tests need root and iproute2 (scripts/test.sh installs it when root); they skip,
saying why, only where that is impossible. Every topology a test creates is removed by a
finalizer, also when the test fails.
"""
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from esync.common import netif
import esync.emulation.namespaces as netns
from support import REPO, needs_netns


@pytest.fixture
def topology():
    """``make(hosts) -> created Topology``; all of them are removed when the test ends."""
    made = []

    def make(hosts):
        topo = netns.Topology(hosts)
        made.append(topo)
        return topo.create()

    yield make
    for topo in made:
        topo.remove()


def ours(tag):
    return [n for n in netns.namespaces() if n.startswith(f"{tag}-")]


def in_namespace(topo, host, code, **kwargs):
    return subprocess.run(topo.exec_prefix(host) + [sys.executable, "-c", code], cwd=REPO,
                          capture_output=True, text=True, timeout=60, **kwargs)


# rates ------------------------------------------------------------------------------------------

def test_rate_units_are_bits_per_second():
    assert [netns.parse_rate(t) for t in ("20mbit", "1gbit", "1.5Mbit", "10mbps")] == \
        [20_000_000, 1_000_000_000, 1_500_000, 80_000_000]


@pytest.mark.parametrize("text", ["20", "fast", "0mbit", "-5mbit", "1kbit"])
def test_bad_rate_is_refused(text):
    with pytest.raises(ValueError):
        netns.parse_rate(text)


def test_subnet_avoids_every_routed_network():
    routed = [ipaddress.ip_network("198.18.0.0/15"), ipaddress.ip_network("10.0.0.0/8")]
    assert str(netns.pick_subnet(routed)) == "172.31.213.0/24"


def test_bad_host_name_is_refused():
    with pytest.raises(ValueError):
        netns.Topology([netns.EmulatedHost("host-0")])


# interface selection ------------------------------------------------------------------------------

def test_route_to_loopback_uses_lo():
    assert netif.route_interface("127.0.0.1") == ("lo", "127.0.0.1")


def test_interface_chosen_by_the_user_is_kept():
    env = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_INTERFACE": "eth7"}
    assert netif.choose_dmlc_interface(env) is None and "DMLC_NODE_HOST" not in env


@needs_netns
def test_interface_routing_to_the_scheduler_is_chosen_among_several(topology):
    topo = topology([netns.EmulatedHost("ps"), netns.EmulatedHost("host0")])
    ns = topo.namespace("host0")
    # a second interface on another network, listed before eth0's address would be by name
    subprocess.run(["ip", "-n", ns, "link", "add", "aaa0", "type", "veth", "peer", "name", "aaa1"],
                   check=True)
    subprocess.run(["ip", "-n", ns, "addr", "add", "10.99.0.1/24", "dev", "aaa0"], check=True)
    for dev in ("aaa0", "aaa1"):
        subprocess.run(["ip", "-n", ns, "link", "set", "dev", dev, "up"], check=True)
    done = in_namespace(topo, "host0", "import os; from esync.common import netif; "
                        "netif.choose_dmlc_interface(); "
                        "print(os.environ['DMLC_INTERFACE'], os.environ['DMLC_NODE_HOST'])",
                        env={"DMLC_PS_ROOT_URI": topo.address("ps"), "PATH": os.environ["PATH"]})
    assert done.stdout.split() == ["eth0", topo.address("host0")], done.stderr


# topologies -------------------------------------------------------------------------------------

@needs_netns
def test_hosts_reach_each_other_over_the_bridge(topology):
    topo = topology([netns.EmulatedHost("ps"), netns.EmulatedHost("host0"), netns.EmulatedHost("host1")])
    server = subprocess.Popen(topo.exec_prefix("ps") + [
        sys.executable, "-c",
        "import socket; s = socket.create_server((%r, 7001)); c, a = s.accept(); "
        "c.sendall(a[0].encode())" % topo.address("ps")], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        done = in_namespace(topo, "host1", "import socket; "
                            f"print(socket.create_connection(({topo.address('ps')!r}, 7001), "
                            "timeout=10).recv(100).decode())")
        assert done.stdout.strip() == topo.address("host1"), done.stderr
    finally:
        server.kill()
        server.wait()


@needs_netns
def test_remove_leaves_no_namespace(topology):
    topo = topology([netns.EmulatedHost("ps"), netns.EmulatedHost("host0", rate="20mbit")])
    assert len(ours(topo.tag)) == 3
    topo.remove()
    assert ours(topo.tag) == []


@needs_netns
def test_topology_of_a_killed_owner_is_removed_by_the_next_one(topology):
    owner = subprocess.run([sys.executable, "-c",
                            "import os, signal; import esync.emulation.namespaces as netns; "
                            "t = netns.Topology([netns.EmulatedHost('ps'), netns.EmulatedHost('host0')]).create(); "
                            "print(t.tag, flush=True); os.kill(os.getpid(), signal.SIGKILL)"],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    tag = owner.stdout.strip()
    assert owner.returncode == -signal.SIGKILL and len(ours(tag)) == 3, owner.stderr
    topology([netns.EmulatedHost("ps")])
    assert ours(tag) == []


@needs_netns
def test_topology_of_a_live_owner_is_kept(topology):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    topo = netns.Topology([netns.EmulatedHost("ps")], owner_pid=owner.pid)
    try:
        topo.create()
        netns.remove_stale()
        assert len(ours(topo.tag)) == 2
    finally:
        topo.remove()
        owner.kill()
        owner.wait()


@needs_netns
def test_process_left_inside_a_removed_topology_is_killed(topology):
    topo = topology([netns.EmulatedHost("ps")])
    sleeper = subprocess.Popen(topo.exec_prefix("ps") + ["sleep", "300"])
    topo.remove()
    assert sleeper.wait(timeout=10) == -signal.SIGKILL


@needs_netns
def test_call_in_opens_sockets_inside_the_namespace_only(topology):
    topo = topology([netns.EmulatedHost("ps")])

    def addresses():
        return sorted(address for _, address in netif.interface_addresses())

    assert netns.call_in(topo.namespace("ps"), addresses) == ["127.0.0.1", topo.address("ps")]
    assert topo.address("ps") not in addresses()      # the calling thread never moved


@needs_netns
def test_worker_announces_the_address_that_routes_to_the_scheduler(topology, fashion_data_dir,
                                                                    tmp_path):
    # host0's eth0 lists an unreachable address first: ps-lite's own choice (the first address
    # of the first non-loopback interface) would announce it and the job would never start.
    topo = topology([netns.EmulatedHost("ps"), netns.EmulatedHost("host0")])
    ns, own = topo.namespace("host0"), f"{topo.address('host0')}/{topo.subnet.prefixlen}"
    for command in (["addr", "flush", "dev", "eth0"], ["addr", "add", "10.99.0.1/24", "dev", "eth0"],
                    ["addr", "add", own, "dev", "eth0"]):
        subprocess.run(["ip", "-n", ns, *command], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    env.update(DMLC_PS_ROOT_URI=topo.address("ps"), DMLC_PS_ROOT_PORT="9000", DMLC_NUM_SERVER="1",
               DMLC_NUM_WORKER="1", OMP_NUM_THREADS="1")
    roles = []
    try:
        for role in ("scheduler", "server"):
            roles.append(subprocess.Popen(topo.exec_prefix("ps") + [sys.executable, "main.py"],
                                          cwd=REPO, env=dict(env, DMLC_ROLE=role),
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        worker = subprocess.run(
            topo.exec_prefix("host0") + [sys.executable, "main.py", "-m", "sync", "-c", "1",
                                         "-n", "lenet", "-b", "8", "--max-rounds", "1",
                                         "--max-seconds", "0", "-ld", str(tmp_path / "logs"),
                                         "-dd", str(fashion_data_dir)],
            cwd=REPO, env=dict(env, DMLC_ROLE="worker"), capture_output=True, text=True,
            timeout=120)
        assert worker.returncode == 0, worker.stderr[-2000:]
    finally:
        for proc in roles:
            proc.kill()
            proc.wait()


def test_without_root_netns_is_refused_naming_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NetnsUnavailable, match="needs root"):
        netns.check_available()


def test_without_ip_netns_is_refused_naming_iproute2(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(netns.NetnsUnavailable, match="install iproute2"):
        netns.check_available()


@needs_netns
def test_port_forward_reaches_a_server_inside_a_namespace(topology):
    topo = topology([netns.EmulatedHost("ps")])
    server = subprocess.Popen(topo.exec_prefix("ps") + [
        sys.executable, "-c",
        "import socket; s = socket.create_server((%r, 7002)); c, _ = s.accept(); "
        "c.sendall(c.recv(100).upper())" % topo.address("ps")])
    relay = netns.PortForward(topo.namespace("ps"), topo.address("ps"), 7002)
    try:
        time.sleep(1.0)
        with socket.create_connection(relay.local, timeout=10) as sock:
            sock.sendall(b"dashboard")
            assert sock.recv(100) == b"DASHBOARD"
    finally:
        relay.close()
        server.kill()
        server.wait()
