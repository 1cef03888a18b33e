"""Which network interface ps-lite should use: the one that routes to the scheduler.

ps-lite announces the address of ``DMLC_INTERFACE`` (or ``DMLC_NODE_HOST``) to the other nodes;
left unset, it takes the first non-loopback interface with an IPv4 address, which on a machine
with several (docker0, a VPN, a second NIC) may be one the other hosts cannot reach. The kernel
already knows the right one: the source address of a route to ``DMLC_PS_ROOT_URI``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import os
import socket
import sys


def source_address(host: str, port: int = 9) -> str:
    """The local IPv4 address the kernel would send from to reach `host` (no packet is sent)."""
    target = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(target)              # UDP connect only picks a route
        return sock.getsockname()[0]


class _IfAddrs(ctypes.Structure):
    pass


_IfAddrs._fields_ = [("next", ctypes.POINTER(_IfAddrs)), ("name", ctypes.c_char_p),
                     ("flags", ctypes.c_uint), ("addr", ctypes.c_void_p),
                     ("netmask", ctypes.c_void_p), ("ifu", ctypes.c_void_p),
                     ("data", ctypes.c_void_p)]


def interface_addresses() -> list[tuple[str, str]]:
    """(interface name, IPv4 address) for every address of every interface (getifaddrs(3)).

    Every address, not one per interface: an interface may hold several, and the one the route
    uses need not be its first (which is all ps-lite itself looks at).
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    head = ctypes.POINTER(_IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise OSError(ctypes.get_errno(), "getifaddrs failed")
    found = []
    try:
        entry = head
        while entry:
            item = entry.contents
            if item.addr:
                raw = ctypes.string_at(item.addr, 8)         # sockaddr_in: family, port, addr
                if int.from_bytes(raw[:2], sys.byteorder) == socket.AF_INET:
                    found.append((item.name.decode(), socket.inet_ntoa(raw[4:8])))
            entry = item.next
    finally:
        libc.freeifaddrs(head)
    return found


def route_interface(host: str) -> tuple[str, str]:
    """(interface name, address) this machine uses to reach `host`."""
    address = source_address(host)
    for name, owned in interface_addresses():
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


def choose_gloo_interface(env=os.environ) -> str | None:
    """Set HOROVOD_GLOO_IFACE to the interface that routes to the rendezvous, if unset (Gloo
    otherwise binds to what the host name resolves to, which on many machines is not the
    network the other workers are on)."""
    if env.get("HOROVOD_GLOO_IFACE") or not env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        return None
    try:
        name, _ = route_interface(env["HOROVOD_GLOO_RENDEZVOUS_ADDR"])
    except OSError:
        return None
    env["HOROVOD_GLOO_IFACE"] = name
    return name
