"""Which network interface ps-lite should use: the one that routes to the scheduler.

ps-lite announces the address of ``DMLC_INTERFACE`` (or ``DMLC_NODE_HOST``) to the other nodes;
left unset, it takes the first non-loopback interface with an IPv4 address, which on a machine
with several (docker0, a VPN, a second NIC) may be one the other hosts cannot reach. The kernel
already knows the right one: the source address of a route to ``DMLC_PS_ROOT_URI``.
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct

SIOCGIFADDR = 0x8915


def source_address(host: str, port: int = 9) -> str:
    """The local IPv4 address the kernel would send from to reach `host` (no packet is sent)."""
    target = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(target)              # UDP connect only picks a route
        return sock.getsockname()[0]


def interface_addresses() -> dict[str, str]:
    """{interface name: its (first) IPv4 address} for every interface that has one."""
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
            except OSError:
                continue                  # no IPv4 address on this interface
            found[name] = socket.inet_ntoa(reply[20:24])
    return found


def route_interface(host: str) -> tuple[str, str]:
    """(interface name, address) this machine uses to reach `host`."""
    address = source_address(host)
    for name, owned in interface_addresses().items():
        if owned == address:
            return name, address
    if ipaddress.ip_address(address).is_loopback:
        return "lo", address
    raise OSError(f"no interface holds {address}, the source address of the route to {host}")


def choose_dmlc_interface(env=os.environ) -> tuple[str, str] | None:
    """Set DMLC_INTERFACE and DMLC_NODE_HOST to the route to DMLC_PS_ROOT_URI, if both unset.

    Returns what was set, or None when the user chose already (either variable set) or the URI
    does not resolve (ps-lite then reports the problem in its own words).
    """
    if env.get("DMLC_INTERFACE") or env.get("DMLC_NODE_HOST") or not env.get("DMLC_PS_ROOT_URI"):
        return None
    try:
        name, address = route_interface(env["DMLC_PS_ROOT_URI"])
    except OSError:
        return None
    env["DMLC_INTERFACE"], env["DMLC_NODE_HOST"] = name, address
    return name, address
