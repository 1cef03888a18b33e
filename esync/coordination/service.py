"""Start and stop an ESync state server process (gunicorn on the Django app of ``state_server/``).

    proc = start_state_server(port=10010, token=token, db_path="logs/state.sqlite3",
                              log_path="logs/state_server.log")
    wait_until_up("http://127.0.0.1:10010", timeout=30, proc=proc)
    ...
    stop(proc)

The server is one gunicorn process with threads (``gthread``): the live decision state of every
job is in that process's memory, so it must never run several worker processes. Migrations run
first (synchronously; the WSGI app also applies pending ones when it loads, so a server started
by hand on a fresh database works too). The process gets its own process
group: ``stop`` ends gunicorn's arbiter and its worker together, ``stop(proc, hard=True)`` kills
them at once (what a crash looks like; the tests use it). Children die with the process that
started them (PR_SET_PDEATHSIG), so a SIGKILLed launcher leaves no server behind.

``python -m esync.coordination.service --host H --port P`` (token and database in ``ESYNC_STATE_TOKEN``
and ``ESYNC_STATE_DB``) migrates and then becomes gunicorn: the one command every launcher
backend runs for the state server.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from esync.common.procs import die_with_parent, free_port, kill_group  # noqa: F401 (free_port: API)

SERVER_DIR = Path(__file__).resolve().parents[2] / "state_server"
DEFAULT_THREADS = 8

ERR_MIGRATE = "state server migrations failed (exit {code}); see {log}:\n{tail}"
ERR_NOT_UP = "state server {url} not answering after {timeout:.0f} s; see its log"
ERR_EXITED = "state server exited with code {code} before answering; log:\n{tail}"


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
    """Migrate ``db_path``, then start gunicorn on ``host:port``; returns the running process.

    ``token`` None generates one; it is available as ``proc.token`` (and ``proc.url``). Output of
    both steps is appended to ``log_path``. Does not wait for the server: see ``wait_until_up``.
    """
    token = token or secrets.token_urlsafe(24)
    db_path = Path(db_path).resolve()          # gunicorn runs from state_server/
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    env = server_env(token=token, db_path=db_path, anonymous=anonymous)
    with open(log_path, "ab") as log:
        code = subprocess.call(migrate_command(python), env=env, stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               preexec_fn=die_with_parent)
        if code != 0:
            raise RuntimeError(ERR_MIGRATE.format(code=code, log=log_path, tail=_tail(log_path)))
        proc = subprocess.Popen(gunicorn_command(host, port, threads, python), env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=die_with_parent)
    proc.token = token
    proc.url = f"http://{_bind_address(host, port)}"
    proc.log_path = log_path
    return proc


def migrate_command(python: str = sys.executable) -> list[str]:
    return [python, str(SERVER_DIR / "manage.py"), "migrate", "--noinput"]


def gunicorn_command(host: str, port: int, threads: int = DEFAULT_THREADS,
                     python: str = sys.executable) -> list[str]:
    return [python, "-m", "gunicorn", "esync_state.wsgi:application",
            "--chdir", str(SERVER_DIR), "--pythonpath", str(SERVER_DIR.parent),
            "--bind", _bind_address(host, port),
            "--workers", "1", "--threads", str(threads),
            # gthread, answering the requests gunicorn itself rejects with JSON, not HTML
            "--worker-class", "esync_state.gunicorn_worker.JsonErrorThreadWorker",
            "--keep-alive", "30", "--graceful-timeout", "5", "--timeout", "60",
            "--no-control-socket", "--error-logfile", "-", "--log-level", "warning"]


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
        kill_group(proc, signal.SIGKILL if hard else signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc, signal.SIGKILL)
            proc.wait()
    if hard:
        kill_group(proc, signal.SIGKILL)       # the gunicorn worker, should it outlive the arbiter
    return proc.returncode


def serve(argv=None) -> int:
    """``python -m esync.coordination.service --host H --port P``: migrate, then become gunicorn.

    One command for the whole state server, so that every launcher backend (local processes,
    ssh, Slurm, Kubernetes) starts it like any other role. The token and database come from
    ``ESYNC_STATE_TOKEN`` and ``ESYNC_STATE_DB``; ``exec`` keeps the pid, the process group and
    the die-with-parent setting of the process the launcher started.
    """
    parser = argparse.ArgumentParser(prog="python -m esync.coordination.service",
                                     description="Run the ESync state server (gunicorn).")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, required=True, help="port to listen on")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="gunicorn threads")
    args = parser.parse_args(argv)
    for name in ("ESYNC_STATE_TOKEN", "ESYNC_STATE_DB"):
        if not os.environ.get(name):
            print(f"esync.coordination.service: error: environment variable {name} is not set",
                  file=sys.stderr)
            return 2
    db_path = Path(os.environ["ESYNC_STATE_DB"]).resolve()     # gunicorn runs from state_server/
    env = server_env(token=os.environ["ESYNC_STATE_TOKEN"], db_path=db_path,
                     anonymous=bool(os.environ.get("ESYNC_STATE_ALLOW_ANONYMOUS")))
    db_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    code = subprocess.call(migrate_command(), env=env, stdin=subprocess.DEVNULL,
                           preexec_fn=die_with_parent)
    if code != 0:
        print(f"esync.coordination.service: error: migrations failed (exit {code})", file=sys.stderr)
        return 1
    command = gunicorn_command(args.host, args.port, args.threads)
    os.execve(command[0], command, env)


if __name__ == "__main__":
    sys.exit(serve())
