"""Start and stop an ESync state server process (gunicorn on the Django app of ``state_server/``).

    proc = start_state_server(port=10010, token=token, db_path="logs/state.sqlite3",
                              log_path="logs/state_server.log")
    wait_until_up("http://127.0.0.1:10010", timeout=30, proc=proc)
    ...
    stop(proc)

The server is one gunicorn process with threads (``gthread``): the live decision state of every
job is in that process's memory, so it must never run several worker processes. The WSGI app
applies pending migrations when it loads, so a fresh database file just works. The process gets its own process
group: ``stop`` ends gunicorn's arbiter and its worker together, ``stop(proc, hard=True)`` kills
them at once (what a crash looks like; the tests use it).
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

SERVER_DIR = Path(__file__).resolve().parents[1] / "state_server"
DEFAULT_THREADS = 8

ERR_NOT_UP = "state server {url} not answering after {timeout:.0f} s; see its log"
ERR_EXITED = "state server exited with code {code} before answering; log:\n{tail}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (for tests and local clusters)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no log)"


def server_env(*, token: str, db_path: str | os.PathLike, anonymous: bool = False,
               base: dict | None = None) -> dict:
    """Environment of a state-server process (see state_server/esync_state/settings/base.py)."""
    env = dict(os.environ if base is None else base)
    env.update({"ESYNC_STATE_TOKEN": token, "ESYNC_STATE_DB": str(db_path),
                "DJANGO_SETTINGS_MODULE": "esync_state.settings", "PYTHONUNBUFFERED": "1"})
    if anonymous:
        env["ESYNC_STATE_ALLOW_ANONYMOUS"] = "1"
    else:
        env.pop("ESYNC_STATE_ALLOW_ANONYMOUS", None)
    return env


def start_state_server(*, host: str = "127.0.0.1", port: int, token: str | None,
                       db_path: str | os.PathLike, log_path: str | os.PathLike,
                       threads: int = DEFAULT_THREADS, anonymous: bool = False,
                       python: str = sys.executable) -> subprocess.Popen:
    """Start gunicorn on ``host:port`` (it migrates ``db_path``); returns the running process.

    ``token`` None generates one; it is available as ``proc.token`` (and ``proc.url``). Output is
    appended to ``log_path``. Does not wait for the server: see ``wait_until_up``.
    """
    token = token or secrets.token_urlsafe(24)
    db_path = Path(db_path).resolve()          # gunicorn runs from state_server/
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    env = server_env(token=token, db_path=db_path, anonymous=anonymous)
    with open(log_path, "ab") as log:
        command = [python, "-m", "gunicorn", "esync_state.wsgi:application",
                   "--chdir", str(SERVER_DIR), "--pythonpath", str(SERVER_DIR.parent),
                   "--bind", _bind_address(host, port), "--workers", "1",
                   "--worker-class", "esync_state.gunicorn_worker.JsonErrorThreadWorker",
                   "--threads", str(threads),
                   "--keep-alive", "30", "--graceful-timeout", "5", "--timeout", "60",
                   "--no-control-socket", "--error-logfile", "-", "--log-level", "warning"]
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    proc.token = token
    proc.url = f"http://{_bind_address(host, port)}"
    proc.log_path = log_path
    return proc


def wait_until_up(url: str, timeout: float = 30.0, *, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url``/health/ until the server answers; raise if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(ERR_EXITED.format(code=proc.returncode,
                                                 tail=_tail(getattr(proc, "log_path", Path()))))
        try:
            if requests.get(url.rstrip("/") + "/health/", timeout=2.0).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() >= deadline:
            raise TimeoutError(ERR_NOT_UP.format(url=url, timeout=timeout))
        time.sleep(0.1)


def stop(proc: subprocess.Popen, *, timeout: float = 10.0, hard: bool = False) -> int:
    """End the server (SIGTERM, then SIGKILL after ``timeout``; ``hard``: SIGKILL at once)."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGKILL if hard else signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
    if hard:
        _signal_group(proc, signal.SIGKILL)       # the gunicorn worker, should it outlive the arbiter
    return proc.returncode


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
