"""Real daemons for the cluster-backend tests: an sshd and a single-node Slurm (with munge).

Each runs from a temporary folder with its own configuration, ports, keys and state, is started
without systemd, and is stopped by its process id (``stop()``), also when the test fails. They
need root and the Debian packages ``scripts/test.sh`` installs; ``why_not_*`` says what is
missing so the tests can skip with that reason.
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited ({proc.returncode}):\n{_read(log)}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"daemon not listening on port {port} after {timeout} s:\n{_read(log)}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen | None, timeout: float = 10) -> None:
    """SIGTERM the daemon's process group, SIGKILL what is left after `timeout`."""
    if proc is None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
            if sig == signal.SIGTERM:
                os.killpg(proc.pid, signal.SIGKILL)     # children left in the group
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            pass
        return


# sshd -------------------------------------------------------------------------------------------

def why_not_sshd() -> str | None:
    if os.geteuid() != 0:
        return "sshd must run as root to log in as this user (run the tests as root)"
    for tool in (SSHD, "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            return (f"{tool} is missing: install openssh-server and openssh-client "
                    "(scripts/test.sh does when run as root)")
    return None


class Sshd:
    """An sshd on 127.0.0.1:<free port> accepting only a key generated in `folder`.

    ``ssh_config`` is a client configuration (port, key, known host) for host 127.0.0.1; pass it
    with ``ssh -F``.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc = None
        self.log = self.folder / "sshd.log"
        self.ssh_config = self.folder / "ssh_config"

    def start(self) -> "Sshd":
        f = self.folder
        for key in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(f / key)],
                           check=True)
        shutil.copy(f / "user_key.pub", f / "authorized_keys")
        (f / "authorized_keys").chmod(0o600)
        (f / "known_hosts").write_text(f"[127.0.0.1]:{self.port} "
                                       f"{(f / 'host_key.pub').read_text()}")
        (f / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {f / 'host_key'}\n"
            f"PidFile {f / 'sshd.pid'}\nAuthorizedKeysFile {f / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nUsePAM no\n"
            "StrictModes no\nMaxStartups 100\nMaxSessions 100\n")
        self.ssh_config.write_text(
            f"Host 127.0.0.1\n  Port {self.port}\n  IdentityFile {f / 'user_key'}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {f / 'known_hosts'}\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n")
        Path("/run/sshd").mkdir(exist_ok=True)       # sshd's privilege-separation folder
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(f / "sshd_config")],
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_for_port(self.port, self.proc, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        _stop(self.proc)


# Slurm ------------------------------------------------------------------------------------------

def why_not_slurm() -> str | None:
    if os.geteuid() != 0:
        return "slurmd must run as root (run the tests as root)"
    for tool in ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "munged"):
        if not shutil.which(tool):
            return (f"{tool} is missing: install slurm-wlm and munge "
                    "(scripts/test.sh does when run as root)")
    try:
        pwd.getpwnam("slurm")
    except KeyError:
        return "the slurm user is missing (the slurm-wlm package creates it)"
    return None


class SlurmCluster:
    """Single-node Slurm: munged, slurmctld and slurmd on this machine, in a temporary folder.

    ``env`` holds ``SLURM_CONF`` for client commands (sbatch, squeue, scancel, submitit). The
    folder is made outside pytest's (private) temporary tree because slurmctld runs as the
    ``slurm`` user and must reach its state folder.
    """

    def __init__(self, cpus: int = 16):
        self.root = Path(tempfile.mkdtemp(prefix="esync-slurm-"))
        self.root.chmod(0o755)
        self.node = socket.gethostname()
        self.cpus = cpus
        self.conf = self.root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs: list[subprocess.Popen] = []

    def _daemon(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.root / "log" / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self) -> "SlurmCluster":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        r = self.root
        slurm = pwd.getpwnam("slurm")
        for sub in ("state", "spool", "munge", "log"):
            (r / sub).mkdir()
        for sub in ("state", "log"):
            os.chown(r / sub, slurm.pw_uid, slurm.pw_gid)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        socket_path = r / "munge" / "munge.sock"
        self._daemon("munged", ["munged", "--foreground", "--force", f"--socket={socket_path}",
                                f"--key-file={key}", f"--pid-file={r / 'munge' / 'munged.pid'}",
                                f"--log-file={r / 'log' / 'munged.log'}",
                                f"--seed-file={r / 'munge' / 'seed'}"])
        deadline = time.monotonic() + 20
        while not socket_path.exists():
            if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                raise RuntimeError(f"munged did not start:\n{_read(r / 'log' / 'munged.out')}")
            time.sleep(0.1)
        ctld_port, d_port = free_port(), free_port()
        self.conf.write_text(f"""\
ClusterName=esynctest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        self._daemon("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._daemon("slurmd", ["slurmd", "-D", "-N", self.node, "-f", str(self.conf)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, text=True,
                                   capture_output=True).stdout.strip()
            if state == "idle":
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.3)
        raise RuntimeError("Slurm did not come up:\n"
                           + "\n".join(_read(p) for p in sorted((r / "log").glob("*"))))

    def jobs(self) -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=self.env, text=True,
                             capture_output=True).stdout
        return [line.split()[0] for line in out.splitlines()
                if line.split()[1] not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT")]

    def stop(self) -> None:
        """Cancel jobs still running (their processes end with them), then stop every daemon."""
        if self.procs and len(self.procs) == 3 and all(p.poll() is None for p in self.procs):
            jobs = self.jobs()
            if jobs:
                subprocess.run(["scancel", *jobs], env=self.env, capture_output=True)
                deadline = time.monotonic() + 30
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.5)
        for proc in reversed(self.procs):
            _stop(proc)
        shutil.rmtree(self.root, ignore_errors=True)
