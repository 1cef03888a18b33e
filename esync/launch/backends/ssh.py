"""Roles on other machines over ssh, placed by a host file.

    # hostfile: one host per line, its address and the devices that get a worker
    10.1.1.29 gpu0,gpu1,cpu
    10.1.1.30 cpu
    esync-cluster --backend ssh --hostfile hosts.txt -ld /shared/esync-logs

The first host also runs the scheduler, the parameter server(s), the state server and the
evaluator. Every host must reach the others by the addresses of the file, log in without a
password (keys; ``--ssh-config`` for a per-job ssh configuration), and see the repository, the
Python and the data at the same paths as this machine (or ``--remote-python``/``--remote-repo``),
and the log folder at the same path: ``check_shared_folder`` proves that before anything starts,
because the evaluator, the summary and the failure messages read logs other hosts write.

Each role runs under ``esync.launch.runner`` on its host: the ssh connection's output carries the
role's exact exit code, and closing the connection's input stops the role, so stopping the
launcher (Ctrl-C, a failure, even SIGKILL) stops every remote process.
"""
from __future__ import annotations

import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from esync.common.errors import UsageError
from esync.launch.backends.base import Backend, Handle
from esync.launch.launches import Launch
from esync.launch.roles import REPO, ClusterConfig, Host, Hosts, RoleSpec
from esync.launch.runner import PID_LINE, parse_exit_line
from esync.common.procs import die_with_parent, kill_group

SSH_FAILED = 255          # ssh's own exit code when the connection failed
DEVICE = re.compile(r"^(cpu|gpu\d+)$")


@dataclass(frozen=True)
class HostLine:
    """One line of the host file: how to ssh to the host, and its devices (one worker each)."""
    target: str                  # what `ssh` gets: address or user@address
    devices: tuple[str, ...]

    @property
    def address(self) -> str:
        return self.target.rsplit("@", 1)[-1]


def read_hostfile(path: str | Path) -> list[HostLine]:
    """Parse a host file (``ADDRESS DEVICE,DEVICE,...`` per line, ``#`` comments)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"--hostfile {path}: cannot read it ({exc.strerror})") from None
    hosts, seen = [], set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"--hostfile {path}, line {number}"
        if len(fields) != 2:
            raise UsageError(f"{where}: expected 'ADDRESS DEVICES' (e.g. '10.1.1.29 gpu0,cpu'), "
                             f"got {line!r}")
        target, devices = fields[0], tuple(d.strip() for d in fields[1].split(","))
        bad = [d for d in devices if not DEVICE.match(d)]
        if bad:
            raise UsageError(f"{where}: {bad[0]!r} is not a device; use cpu or gpuN")
        host = HostLine(target, devices)
        if host.address in seen:
            raise UsageError(f"{where}: host {host.address} is listed twice; give all its "
                             "devices on one line")
        seen.add(host.address)
        hosts.append(host)
    if not hosts:
        raise UsageError(f"--hostfile {path}: no hosts in it (one 'ADDRESS DEVICES' per line)")
    return hosts


def placement(lines: list[HostLine]) -> tuple[Hosts, list[str]]:
    """The plan's placement (services on the first host, one worker per device) and the devices
    in worker order."""
    hosts = {line.address: Host(line.address, line.address) for line in lines}
    workers, devices = [], []
    for line in lines:
        for device in line.devices:
            workers.append(hosts[line.address])
            devices.append(device)
    return Hosts(ps=hosts[lines[0].address], workers=tuple(workers)), devices


# The flags ----------------------------------------------------------------------------------

PLACED_BY = "--hostfile"          # what places the workers (instead of --workers/--devices)


def add_arguments(parser) -> set[str]:
    """The ssh backend's flags; returns their dests (launcher-only: never passed to main.py)."""
    s = parser.add_argument_group("ssh backend")
    s.add_argument("--hostfile", help="one host per line: ADDRESS DEVICE,DEVICE,... (e.g. "
                                      "'10.1.1.29 gpu0,gpu1,cpu'); the first also runs the "
                                      "scheduler, server(s), state server and evaluator")
    s.add_argument("--ssh-config", help="ssh configuration file (ssh -F) for every connection")
    s.add_argument("--ssh-option", action="append", default=[], metavar="OPTION",
                   help="an ssh -o option for every connection (repeatable)")
    s.add_argument("--remote-python", help="Python on the hosts; default: this machine's")
    s.add_argument("--remote-repo", help="the repository on the hosts; default: this machine's")
    return {"hostfile", "ssh_config", "ssh_option", "remote_python", "remote_repo"}


def placed_devices(args) -> list[str]:
    """The devices of the host file, in worker order."""
    if not args.hostfile:
        raise UsageError("--backend ssh needs --hostfile FILE (one 'ADDRESS DEVICES' line "
                         "per host)")
    return placement(read_hostfile(args.hostfile))[1]


class Ssh:
    """The ssh command line shared by every connection of a job."""

    def __init__(self, config: str | None = None, options: tuple[str, ...] = ()):
        self.base = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=20"]
        if config:
            self.base += ["-F", str(config)]
        for option in options:
            self.base += ["-o", option]

    def command(self, target: str, remote: str) -> list[str]:
        return [*self.base, target, remote]

    def run(self, target: str, remote: str, timeout: float = 60) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.command(target, remote), capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([], SSH_FAILED, "", f"no answer in {timeout} s")


def check_hosts(ssh: Ssh, lines: list[HostLine], log_dir: Path, data_dir: Path,
                python: str, repo: str) -> dict[str, int]:
    """Every host logs in, sees this machine's log folder (a probe file written here), the data,
    the repository and the Python; else one line naming the host and what it lacks. Returns
    each host's cores (``nproc``; by address) for the workers' threads."""
    cores = {}
    log_dir.mkdir(parents=True, exist_ok=True)
    probe = log_dir / f".esync-shared-{secrets.token_hex(8)}"
    token = secrets.token_hex(16)
    probe.write_text(token)
    try:
        for line in lines:
            checks = (f"cat {shlex.quote(str(probe))} || exit 11; echo; "
                      f"test -d {shlex.quote(str(data_dir / 'fashion-mnist'))} || exit 12; "
                      f"test -f {shlex.quote(str(Path(repo) / 'main.py'))} || exit 13; "
                      f"test -x {shlex.quote(python)} || exit 14; nproc")
            done = ssh.run(line.target, checks)
            if done.returncode == SSH_FAILED:
                raise UsageError(f"--hostfile: cannot ssh to {line.target}: "
                                 f"{done.stderr.strip() or 'ssh failed'} (keys must allow "
                                 "logging in without a password; see --ssh-config)")
            lacks = {11: f"does not see the log folder {log_dir}: -ld must be a folder every "
                         "host shares (NFS...) at the same path",
                     12: f"has no data at {data_dir}/fashion-mnist: prepare it there or share "
                         "-dd like the log folder",
                     13: f"has no {repo}/main.py: give --remote-repo",
                     14: f"has no Python at {python}: give --remote-python"}
            if done.returncode in lacks:
                raise UsageError(f"host {line.target} {lacks[done.returncode]}")
            seen = done.stdout.split()
            if done.returncode != 0 or not seen or seen[0] != token:
                raise UsageError(f"host {line.target} does not see the log folder {log_dir} as "
                                 "this machine does: -ld must be a folder every host shares")
            if len(seen) > 1 and seen[1].isdigit():
                cores[line.address] = int(seen[1])
    finally:
        probe.unlink(missing_ok=True)
    return cores


def free_ports(ssh: Ssh, target: str, python: str, count: int = 2) -> list[int]:
    """Ports free right now on `target` (where the scheduler and the state server will listen)."""
    probe = ("import socket; s = [socket.socket() for _ in range(%d)]; "
             "[x.bind(('', 0)) for x in s]; print(*[x.getsockname()[1] for x in s])" % count)
    done = ssh.run(target, f"{shlex.quote(python)} -c {shlex.quote(probe)}")
    try:
        ports = [int(p) for p in done.stdout.split()]
    except ValueError:
        ports = []
    if done.returncode != 0 or len(ports) != count:
        why = done.stderr.strip() or "no answer"
        raise UsageError(f"cannot find free ports on {target} ({why}); give --port and "
                         "--state-port")
    return ports


class SshHandle(Handle):
    def __init__(self, spec: RoleSpec, ssh: Ssh, target: str, remote: str, log: Path):
        super().__init__(spec)
        self.ssh, self.target, self.log_path = ssh, target, log
        self.ssh_log = log.with_name(log.stem + ".ssh.log")
        self.pids: tuple[int, int] | None = None      # the runner's and the role's, remotely
        self.code: int | None = None
        with open(self.ssh_log, "ab") as err:
            self.proc = subprocess.Popen(ssh.command(target, remote), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err,
                                         start_new_session=True, preexec_fn=die_with_parent)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith(PID_LINE):
                try:
                    self.pids = tuple(int(p) for p in line.split()[-2:])
                except ValueError:
                    pass
            code = parse_exit_line(line)
            if code is not None:
                self.code = code

    def poll(self) -> int | None:
        if self.proc.poll() is None:
            return None
        self.reader.join(timeout=5)
        return self.code if self.code is not None else SSH_FAILED

    def terminate(self, hard: bool = False) -> None:
        if self.proc.poll() is not None:
            return
        if not hard:
            try:                     # the runner stops the role when its input closes
                self.proc.stdin.close()
            except OSError:
                pass
            return
        if self.pids:
            runner, role = self.pids
            self.ssh.run(self.target, f"kill -KILL -- -{role} {runner} 2>/dev/null; true",
                         timeout=20)
        kill_group(self.proc, signal.SIGKILL)
        self.proc.wait()

    def tail(self, lines: int = 20) -> str:
        text = _read(self.log_path)
        errors = _read(self.ssh_log).strip()
        if errors:
            text += f"\n(ssh to {self.target}: {errors})"
        return "\n".join(text.splitlines()[-lines:]) or "(no log)"

    def describe(self) -> str:
        where = f"on {self.target}"
        return f"{where}, pid {self.pids[1]}" if self.pids else where

    @property
    def log(self) -> str:
        return str(self.log_path)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class SshBackend(Backend):
    """Each spec runs on the host named by ``spec.host`` (an address of the host file)."""

    def __init__(self, targets: dict[str, str], ssh: Ssh, *, python: str | None = None,
                 repo: str | None = None):
        self.targets, self.ssh = targets, ssh
        self.python, self.repo = python, repo or str(REPO)
        self.handles: list[SshHandle] = []

    def remote_command(self, spec: RoleSpec, log: Path) -> str:
        python = self.python or spec.argv[0]
        argv = [python, *spec.argv[1:]]
        env = [f"{k}={v}" for k, v in spec.env.items()]
        runner = [python, "-m", "esync.launch.runner", "--log", str(log), "--watch-stdin", "--"]
        return (f"cd {shlex.quote(self.repo)} && exec env "
                + " ".join(map(shlex.quote, env + runner + argv)))

    def start(self, specs: list[RoleSpec], proc_dir: Path) -> list[Handle]:
        proc_dir = Path(proc_dir)
        proc_dir.mkdir(parents=True, exist_ok=True)
        started = []
        try:
            for spec in specs:
                log = proc_dir / f"{spec.name}.log"
                target = self.targets.get(spec.host, spec.host)
                handle = SshHandle(spec, self.ssh, target, self.remote_command(spec, log), log)
                self.handles.append(handle)
                started.append(handle)
        except BaseException:
            for handle in started:
                handle.terminate(hard=True)
            raise
        return started

    def close(self) -> None:
        for handle in self.handles:
            handle.terminate()
        for handle in self.handles:
            try:
                handle.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                handle.terminate(hard=True)


# The launch ----------------------------------------------------------------------------------

class SshLaunch(Launch):
    """The hosts of ``--hostfile``, reached over ssh; the first runs the ps-side roles."""

    def __init__(self, args, parser):
        self.lines = read_hostfile(args.hostfile)
        hosts, devices = placement(self.lines)
        self.ssh = Ssh(args.ssh_config, tuple(args.ssh_option))
        self.python = args.remote_python or sys.executable
        self.repo = args.remote_repo or str(REPO)
        self.targets = {line.address: line.target for line in self.lines}
        self.cores = check_hosts(self.ssh, self.lines, Path(args.log_dir), Path(args.data_dir),
                                 self.python, self.repo)
        super().__init__(args, parser, hosts=hosts, devices=devices)

    def machines(self) -> tuple[list[str], dict[str, int], str]:
        """Each host of the file is a machine, of the cores ``nproc`` showed there."""
        return [host.name for host in self.hosts.workers], self.cores, self.hosts.ps.name

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        port, state = self.args.port, self.args.state_port
        if not (port and state):
            free = free_ports(self.ssh, self.lines[0].target, self.python)
            port, state = port or free[0], state or free[1]
        main_py = str(Path(self.repo) / "main.py")
        return self.config_with(port, state, resume=resume, overwrite=overwrite,
                                python=self.python, main_py=main_py)

    def backend(self):
        return SshBackend(self.targets, self.ssh, python=self.python, repo=self.repo)
