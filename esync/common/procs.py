"""Process helpers shared by the launcher, the benchmark and the state-server starter.

Every child we start gets its own process group (``start_new_session=True``) so that one signal
reaches it and whatever it forked (gunicorn's worker, for one), and ``die_with_parent`` so that
it gets SIGKILL from the kernel if the process that started it dies, even by SIGKILL, when no
Python code of ours runs any more.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
# The checkout: the folder every child process of a job starts in (main.py is there).
REPO = Path(__file__).resolve().parents[2]


def python_env() -> dict[str, str]:
    """What every Python process of a job gets in its environment, whatever its role.

    Unbuffered output, so that logs show what happened as it happens. And, where Python still
    ships its own distutils (before 3.12), that one: MXNet imports ``distutils.version``, and
    the shim setuptools installs in every interpreter would load much of setuptools for it
    (about 0.2 s of CPU in each of a job's processes, all importing at once on two cores;
    ``SETUPTOOLS_USE_DISTUTILS`` is setuptools' own switch).
    """
    env = {"PYTHONUNBUFFERED": "1"}
    if sys.version_info < (3, 12):
        env["SETUPTOOLS_USE_DISTUTILS"] = "stdlib"
    return env


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (None: no such process): with
    the pid, it names one process, since a pid is reused once its process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def kill_group(proc_or_pid: subprocess.Popen | int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process group led by ``proc_or_pid``; a group already gone is fine."""
    pid = proc_or_pid if isinstance(proc_or_pid, int) else proc_or_pid.pid
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a server could listen on ``host:port`` now. Like gunicorn and ZeroMQ, the probe
    uses SO_REUSEADDR: connections of a stopped server in TIME_WAIT do not make a port busy."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def die_with_parent() -> None:
    """Child side (``preexec_fn``): SIGKILL this process when its parent dies.

    The kernel ties this to the *thread* that forked the child, so start children from a thread
    that lives as long as they should (the launcher uses its main thread). It survives ``exec``.
    """
    try:
        parent = os.getppid()
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:       # the parent died before prctl took effect
            os._exit(1)
    except OSError:
        pass
