"""The small interface between the supervisor and wherever the processes run.

A ``Backend`` starts role specs and returns one ``Handle`` per spec; the supervisor only ever
polls, terminates and reads the log tail of handles, so local processes, network namespaces,
ssh, Slurm and Kubernetes are supervised alike. ``start`` takes the whole list because some
backends start every role at once (one Slurm job); it is also called with a single spec to
restart one role in place (the state server), which a backend that cannot do so refuses with
``NotImplementedError`` (the supervisor then treats the death as a failure).
"""
from __future__ import annotations

from pathlib import Path

from esync.launch.roles import RoleSpec


class Handle:
    """One started role. Subclasses implement ``poll``, ``terminate`` and ``tail``."""

    def __init__(self, spec: RoleSpec):
        self.spec = spec
        self.name = spec.name
        self.kind = spec.kind

    def poll(self) -> int | None:
        """Exit code once it ended (negative: killed by that signal), else None."""
        raise NotImplementedError

    def terminate(self, hard: bool = False) -> None:
        """Ask it to stop (SIGTERM), or with ``hard`` kill it and everything it started."""
        raise NotImplementedError

    def tail(self, lines: int = 20) -> str:
        """The last lines of its output."""
        raise NotImplementedError

    def describe(self) -> str:
        """Where it runs and what it is doing now (e.g. "pid 4242, stopped"), if known."""
        return ""

    @property
    def log(self) -> str:
        """Where its full output is (a path or a description)."""
        return ""


class Backend:
    def start(self, specs: list[RoleSpec], proc_dir: Path) -> list[Handle]:
        """Start every spec (output to ``proc_dir/<name>.log``, appended); one handle per spec,
        in the same order. On an error, whatever was started is stopped before raising."""
        raise NotImplementedError

    def run_on(self, host: str, fn, *args):
        """``fn(*args)`` with the network view of `host` (pick a free port there, ask a server on
        it). Here: this machine's; a backend whose hosts see another network overrides it."""
        return fn(*args)

    def reachable(self, host: str, address: str, port: int) -> tuple[str, int]:
        """Where the launcher's user reaches a server listening on `host` at address:port
        (the dashboard). Here: the same; a backend whose hosts are out of reach relays it."""
        return address, port

    def close(self) -> None:
        """Kill whatever this backend started that is still running and free its resources.
        Idempotent; called on every way out."""
