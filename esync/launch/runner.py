"""Run one role on the host it was placed on, for backends that start roles remotely.

    python -m esync.launch.runner --log LOG [--exit-file F] [--stop-file F] [--watch-stdin] \\
        -- COMMAND...
    python -m esync.launch.runner --log-dir DIR --plan plan.json --role NAME -- (from the plan)

ssh, Slurm and Kubernetes start this small wrapper instead of the role itself, because each
needs something a bare ``python main.py`` cannot give:

- the exact exit code (a negative number for a signal) as the last line ``esync-runner exit N``
  on its output and, with ``--exit-file``, in a file of the shared log folder (a Slurm task's
  status is only "finished");
- a way to stop the role from afar: SIGTERM/SIGINT/SIGHUP to the runner reach the role's whole
  process group; ``--stop-file`` stops it when that file appears; ``--watch-stdin`` stops it when
  its standard input closes (the ssh connection, hence the launcher, is gone), so nothing
  outlives the launcher on a remote host;
- the role's output appended to its log in the shared folder.

With ``--plan`` the role is picked from a JSON list of role specs (what ``plan_roles`` returns):
by ``--role NAME``, or by ``--role worker --group cpu|gpu --index-env VAR`` for the VAR-th worker
of that device kind (Kubernetes' ``JOB_COMPLETION_INDEX``, Slurm's ``SLURM_PROCID``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from esync.common.procs import die_with_parent, kill_group

EXIT_LINE = "esync-runner exit"
PID_LINE = "esync-runner pid"
STOP_GRACE = 10.0        # seconds between SIGTERM and SIGKILL when the role is stopped


def exit_line(code: int) -> str:
    return f"{EXIT_LINE} {code}"


def parse_exit_line(line: str) -> int | None:
    if line.startswith(EXIT_LINE + " "):
        try:
            return int(line.split()[-1])
        except ValueError:
            return None
    return None


class Role:
    """The role's process (its own process group) and the ways to stop it."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: str | None):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"--- started on {os.uname().nodename} at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
            out.flush()
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=cwd,
                                         start_new_session=True, preexec_fn=die_with_parent)
        self._stopping = threading.Event()

    def stop(self, *_):
        """SIGTERM the role's group, SIGKILL it STOP_GRACE seconds later if still there."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        kill_group(self.proc, signal.SIGTERM)
        threading.Thread(target=self._kill_later, daemon=True).start()

    def _kill_later(self):
        try:
            self.proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            pass
        kill_group(self.proc, signal.SIGKILL)

    def wait(self) -> int:
        code = self.proc.wait()
        kill_group(self.proc, signal.SIGKILL)        # whatever it forked and left behind
        return code


def run(argv: list[str], *, log: Path, env: dict[str, str] | None = None, cwd: str | None = None,
        exit_file: Path | None = None, stop_file: Path | None = None,
        watch_stdin: bool = False) -> int:
    """Run the role to its end; returns its exit code (negative: killed by that signal)."""
    role = Role(argv, dict(os.environ if env is None else env), Path(log), cwd)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, role.stop)
    print(f"{PID_LINE} {os.getpid()} {role.proc.pid}", flush=True)
    if watch_stdin:
        threading.Thread(target=_stop_on_eof, args=(role,), daemon=True).start()
    if stop_file is not None:
        threading.Thread(target=_stop_on_file, args=(role, Path(stop_file)), daemon=True).start()
    code = role.wait()
    if exit_file is not None:
        _write_exit(Path(exit_file), code)
    print(exit_line(code), flush=True)
    return code


def _stop_on_eof(role: Role) -> None:
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    role.stop()


def _stop_on_file(role: Role, path: Path) -> None:
    while role.proc.poll() is None:
        if path.exists():
            role.stop()
            return
        time.sleep(0.5)


def _write_exit(path: Path, code: int) -> None:
    from esync.common.files import atomic_write_text
    atomic_write_text(path, f"{code}\n")


def read_exit(path: Path) -> int | None:
    """The exit code a runner wrote to ``path``, or None while there is none."""
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


# Picking a role from a plan -------------------------------------------------------------------

def spec_to_json(spec) -> dict:
    return {"name": spec.name, "kind": spec.kind, "argv": list(spec.argv), "env": dict(spec.env),
            "host": spec.host, "device": spec.device, "rank": spec.rank}


def pick(plan: list[dict], role: str, group: str | None = None, index: int | None = None) -> dict:
    """The spec named `role`, or with `group` the `index`-th worker on that kind of device."""
    if group is None:
        for spec in plan:
            if spec["name"] == role:
                return spec
        raise LookupError(f"no role {role!r} in the plan (roles: "
                          f"{', '.join(s['name'] for s in plan)})")
    members = [s for s in plan if s["kind"] == role and device_kind(s["device"]) == group]
    if index is None or not 0 <= index < len(members):
        raise LookupError(f"index {index} is outside the {len(members)} {group} {role}s")
    return members[index]


def device_kind(device: str) -> str:
    return "gpu" if device.startswith("gpu") else "cpu"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m esync.launch.runner",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", help="append the role's output to this file")
    parser.add_argument("--log-dir", help="with --plan: the log is LOG_DIR/<role name>.log")
    parser.add_argument("--exit-file", help="write the exit code to this file at the end")
    parser.add_argument("--stop-file", help="stop the role when this file appears")
    parser.add_argument("--watch-stdin", action="store_true",
                        help="stop the role when standard input closes")
    parser.add_argument("--cwd", help="run the role in this folder")
    parser.add_argument("--plan", help="a JSON list of role specs to pick the role from")
    parser.add_argument("--role", help="with --plan: a role name, or a kind with --group")
    parser.add_argument("--group", choices=["cpu", "gpu"], help="with --plan: device kind")
    parser.add_argument("--index-env", help="with --group: variable holding the worker's index")
    parser.add_argument("--node-host-env",
                        help="set DMLC_NODE_HOST from this variable (e.g. the pod's IP)")
    parser.add_argument("command", nargs="*", help="the role's command (without --plan)")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    command = args.command
    log = args.log
    if args.plan:
        try:
            index = int(os.environ[args.index_env]) if args.index_env else None
            spec = pick(json.loads(Path(args.plan).read_text()), args.role, args.group, index)
        except (OSError, ValueError, KeyError, LookupError) as exc:
            print(f"esync-runner: error: cannot pick the role: {exc}", file=sys.stderr)
            return 2
        env.update(spec["env"])
        command = spec["argv"]
        log = log or str(Path(args.log_dir or ".") / f"{spec['name']}.log")
    if args.node_host_env and os.environ.get(args.node_host_env) and "DMLC_ROLE" in env:
        env["DMLC_NODE_HOST"] = os.environ[args.node_host_env]
    if not command or not log:
        parser.error("give the role's command after -- and --log (or --plan and --role)")
    code = run(command, log=Path(log), env=env, cwd=args.cwd,
               exit_file=Path(args.exit_file) if args.exit_file else None,
               stop_file=Path(args.stop_file) if args.stop_file else None,
               watch_stdin=args.watch_stdin)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    status = main()
    # Not sys.exit: the thread blocked reading standard input would make the interpreter's
    # shutdown abort ("could not acquire lock for <stdin>") and replace the exit status.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
