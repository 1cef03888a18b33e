"""Processes on this machine: one process group per role, each dying with the launcher."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from esync.launch.backends.base import Backend, Handle
from esync.common.speeds import CPU_CGROUP_ENV
from esync.launch.cgroups import CpuCaps, SpeedShifter
from esync.launch.roles import REPO, RoleSpec
from esync.common.procs import die_with_parent, kill_group

PROCESS_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O",
                  "T": "stopped", "t": "stopped by a debugger", "Z": "exited (zombie)"}


def base_environment() -> dict[str, str]:
    """The launcher's environment without ps-lite settings, which every role gets from its spec."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}


class LocalHandle(Handle):
    def __init__(self, spec: RoleSpec, proc: subprocess.Popen, log: Path):
        super().__init__(spec)
        self.proc, self.log_path = proc, log
        self._group_cleared = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def terminate(self, hard: bool = False) -> None:
        # The group, not only the process: gunicorn's worker, for one, must go with its arbiter.
        # Once the leader is gone and its group was killed, the id may be reused: leave it be.
        if self._group_cleared:
            return
        ended = self.proc.poll() is not None
        kill_group(self.proc, signal.SIGKILL if hard else signal.SIGTERM)
        if hard:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self._group_cleared = ended

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def describe(self) -> str:
        if self.proc.poll() is not None:
            return f"pid {self.pid}, exited"
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
            state = stat[stat.rindex(")") + 2]
        except (OSError, ValueError, IndexError):
            return f"pid {self.pid}"
        return f"pid {self.pid}, {PROCESS_STATES.get(state, state)}"

    @property
    def log(self) -> str:
        return str(self.log_path)


class LocalBackend(Backend):
    """Popen on this machine. Every child gets its own process group (one signal stops it and
    what it forked) and PR_SET_PDEATHSIG (the kernel kills it if the launcher dies, even by
    SIGKILL). Start it from the launcher's main thread: the death signal follows the thread."""

    def __init__(self, cwd: Path = REPO, base_env: dict[str, str] | None = None,
                 caps: CpuCaps | None = None):
        self.cwd = Path(cwd)
        self.base_env = base_environment() if base_env is None else dict(base_env)
        self.handles: list[LocalHandle] = []
        self.caps = caps                  # a worker with spec.cpu_cores runs in its own group
        self.shifter: SpeedShifter | None = None

    def shift_speeds(self, shifter: SpeedShifter) -> None:
        """Change the workers' CPU caps as ``shifter``'s schedule says (started with them)."""
        self.shifter = shifter

    def start(self, specs: list[RoleSpec], proc_dir: Path) -> list[Handle]:
        proc_dir = Path(proc_dir)
        proc_dir.mkdir(parents=True, exist_ok=True)
        started = []
        try:
            for spec in specs:
                log = proc_dir / f"{spec.name}.log"
                with open(log, "ab") as out:
                    out.write(f"--- esync-cluster started {spec.name} at "
                              f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode())
                    out.flush()
                    proc = subprocess.Popen(self.command(spec),
                                            env={**self.base_env, **spec.env,
                                                 **self.cap_environment(spec)},
                                            stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=str(self.cwd),
                                            start_new_session=True, preexec_fn=die_with_parent)
                handle = LocalHandle(spec, proc, log)
                self.handles.append(handle)
                started.append(handle)
        except BaseException:
            for handle in started:
                handle.terminate(hard=True)
            raise
        if self.shifter is not None:
            self.shifter.start(proc_dir.parent)
        return started

    def cap_environment(self, spec: RoleSpec) -> dict[str, str]:
        """A capped worker's group, made and capped now; the worker joins it when its training
        starts (``esync.common.speeds.join_cpu_cap``), so that imports, data loading and the
        rendezvous run at the machine's speed and only training runs at the device's."""
        if spec.cpu_cores is None:
            return {}
        if self.caps is None:
            raise RuntimeError(f"{spec.name} asks for a CPU cap but this launcher has no cgroups")
        group = self.caps.cap(spec.device, spec.cpu_cores)
        return {CPU_CGROUP_ENV: str(group)}

    def command(self, spec: RoleSpec) -> list[str]:
        """The command line that starts `spec` (a subclass may wrap it, e.g. in a namespace)."""
        return list(spec.argv)

    def close(self) -> None:
        try:
            if self.shifter is not None:
                self.shifter.stop()
            for handle in self.handles:
                handle.terminate(hard=True)
        finally:
            if self.caps is not None:
                self.caps.close()         # idempotent; the groups go with the processes
