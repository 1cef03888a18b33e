"""The local backend: processes on this machine, one process group per role, each dying with the
launcher; ``LocalLaunch`` places every role here (on loopback, or in the emulated hosts of
``--net netns``) and ``cpu_caps`` decides whether slow devices are emulated by CPU caps.

    esync-cluster                                   # the default: --backend local
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from esync.common import runlayout
from esync.common.errors import UsageError
from esync.common.procs import die_with_parent, free_port, kill_group, port_is_free
from esync.common.speeds import CPU_CGROUP_ENV
from esync.emulation.cgroups import CpuCaps, SpeedShifter
from esync.launch.backends.base import Backend, Handle
from esync.launch import gpus
from esync.launch.launches import Launch, emulates, planned_devices
from esync.launch.resources import CUDA_VISIBLE_DEVICES, gpu_index, within
from esync.launch.roles import REPO, ClusterConfig, Hosts, RoleSpec, device_names

LOCAL_ADDRESS = "127.0.0.1"       # the local backend's one host
THIS_MACHINE = "this machine"     # what every local worker shares (resources.worker_threads)

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
                    proc = subprocess.Popen(self.command(spec), env=self.environment(spec),
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

    def environment(self, spec: RoleSpec) -> dict[str, str]:
        """The launcher's environment, the spec's, its CPU cap's; a GPU index of the plan is
        one of the GPUs the launcher itself may use (its own CUDA_VISIBLE_DEVICES, if set)."""
        env = {**self.base_env, **spec.env, **self.cap_environment(spec)}
        if CUDA_VISIBLE_DEVICES in spec.env:
            env[CUDA_VISIBLE_DEVICES] = within(spec.env[CUDA_VISIBLE_DEVICES],
                                               self.base_env.get(CUDA_VISIBLE_DEVICES))
        return env

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


class LocalLaunch(Launch):
    """Processes on this machine: on loopback, or in emulated hosts (``--net netns``)."""

    def __init__(self, args, parser, backend: Backend | None = None, hosts: Hosts | None = None,
                 *, cpu_share: float | None = None):
        self._backend = backend or LocalBackend()
        self.cpu_share = cpu_share
        self.emulation = "sleep" if cpu_share is None else "cpu-cap"
        hosts = hosts or Hosts.single(args.host_name, LOCAL_ADDRESS, args.workers)
        super().__init__(args, parser, hosts=hosts, devices=planned_devices(args))

    def machines(self) -> tuple[list[str], dict[str, int], str]:
        """One machine, this one (emulated hosts share its cores), of the cores it lets us use."""
        return [THIS_MACHINE] * len(self.devices), \
            {THIS_MACHINE: len(os.sched_getaffinity(0))}, THIS_MACHINE

    def evaluator_gpu(self) -> int | None:
        """A GPU of this machine that no worker trains on, when MXNet here is a CUDA build."""
        flavour = gpus.installed_flavour()
        if flavour is None or not gpus.wheel(flavour).cuda:
            return None
        used = [gpu_index(d) for d in self.devices if gpu_index(d) is not None]
        return gpus.free_gpu(used, len(gpus.gpu_capabilities()))

    @classmethod
    def create(cls, args, parser) -> "LocalLaunch":
        """--net netns builds the emulated hosts now (clearing what dead launchers left first);
        CPU caps make a cgroup per capped device (clearing what dead launchers left first).
        The supervisor's close() of the backend removes both on every way out."""
        # netns builds on this module's LocalBackend: read it when a launch is made.
        from esync.emulation.hosts import layout_from_args
        from esync.launch.backends.netns import NetnsBackend
        caps, share = cpu_caps(args)
        layout = layout_from_args(args, args.workers)
        backend = LocalBackend(caps=caps) if layout is None else NetnsBackend(
            layout, caps=caps, links_file=runlayout.links_file(runlayout.mode_dir(args)))
        try:
            hosts = None
            if layout is not None:
                backend.create()
                hosts = backend.placement()
            launch = cls(args, parser, backend, hosts, cpu_share=share)
            if caps is not None:
                launch.cfs_slice_us = caps.min_run_us
            if caps is not None and args.speed_schedule:
                backend.shift_speeds(launch.speed_shifter(caps))
            return launch
        except BaseException:
            backend.close()
            raise

    def speed_shifter(self, caps):
        from esync.emulation.schedules import parse_speed_schedule
        from esync.emulation.cgroups import SpeedShifter
        capped = {name: Path(host.name) / name
                  for name, host, cores in zip(device_names(self.devices), self.hosts.workers,
                                               self.cpu_cores()) if cores is not None}
        return SpeedShifter(caps, self.cpu_share, parse_speed_schedule(self.args.speed_schedule),
                            capped)

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        """The plan's input; ports are picked again for each start unless the user fixed them."""
        a, address = self.args, self.hosts.ps.address
        port = a.port or self.on_ps_host(free_port, address)
        if not self.on_ps_host(port_is_free, port, address):
            raise UsageError(f"argument --port: port {port} is in use; pick another or "
                             "leave --port out to get a free one")
        state_port = None
        if self.uses_state_server:
            state_port = a.state_port or self.on_ps_host(free_port, address)
            if not self.on_ps_host(port_is_free, state_port, address):
                raise UsageError(f"argument --state-port: port {state_port} is in use")
        return self.config_with(port, state_port, resume=resume, overwrite=overwrite)

    def on_ps_host(self, fn, *args):
        return self._backend.run_on(self.hosts.ps.name, fn, *args)

    def plan(self):
        if self.uses_state_server:
            address, port = self._backend.reachable(self.hosts.ps.name, self.hosts.ps.address,
                                                    self.config.state_port)
            print(f"esync-cluster: dashboard at http://{address}:{port}/dashboard/"
                  f"?job={self.args.job}", flush=True)
        return super().plan()

    def backend(self) -> Backend:
        return self._backend


def cpu_caps(args):
    """(CpuCaps, share) when CPU workers are emulated by caps, else (None, None): a run of
    real devices (no factor above 1, no speed schedule, no ``--emulation cpu-cap``) caps nothing.

    ``--emulation auto`` falls back to sleeping, with one warning, where cgroups are out of
    reach (not root, no cpu controller); ``cpu-cap`` then is an error. The default share is the
    most that fits every device's cap (at its fastest, over a speed schedule) and a reserve for
    the parameter server, scheduler, evaluator and state server into this machine's cores.
    """
    from esync.emulation.schedules import parse_speed_schedule
    from esync.emulation.cgroups import CgroupError, CgroupsUnavailable, CpuCaps, default_share
    devices = planned_devices(args)
    if args.emulation == "sleep" or "cpu" not in devices or not emulates(args):
        return None, None
    try:
        caps = CpuCaps()
    except (CgroupsUnavailable, CgroupError) as why:
        if args.emulation == "cpu-cap":
            raise UsageError(f"--emulation cpu-cap: {why}") from None
        print(f"esync-cluster: warning: no CPU caps ({why}); emulating slow devices by "
              "sleeping", file=sys.stderr)
        return None, None
    schedule = parse_speed_schedule(args.speed_schedule) if args.speed_schedule else {}
    factors = [min([f] + [g for _, g in schedule.get(name, [])])
               for name, d, f in zip(device_names(devices), devices, args.slowdowns)
               if d == "cpu"]
    cores = len(os.sched_getaffinity(0))
    try:
        share = args.cpu_share or default_share(factors, cores=cores)
    except ValueError as exc:
        caps.close()
        raise UsageError(f"--emulation: {exc}; give --cpu-share") from None
    slice_note = ""
    if caps.kernel_slice_us and caps.min_run_us < caps.kernel_slice_us:
        slice_note = (f"; the kernel's CFS bandwidth slice is {caps.min_run_us / 1000:g} ms "
                      f"while they run ({caps.kernel_slice_us / 1000:g} ms before)")
    print(f"esync-cluster: emulating slow devices by CPU caps ({caps.controller.describe()}): "
          f"a x1 device gets {share:.2f} of a core (--cpu-share), a xF device 1/F of that"
          f"{slice_note}; "
          + ("each device's compute moves between cores (--no-cpu-pinning)"
             if args.no_cpu_pinning else "each device computes on one core (cluster.json "
             "says which)"), flush=True)
    return caps, share
