"""The launches esync-cluster runs: one class per kind of placement, one interface for ``main``.

A ``Launch`` holds the resolved flags (never changed), the hosts and devices of its placement, and
its ``ClusterConfig`` (the plan's input: immutable, rebuilt only when a restart picks new ports).
``main`` sees only this interface; what differs between backends lives in the subclasses:

- ``LocalLaunch``: processes on this machine, on loopback or in emulated hosts (``--net netns``);
- ``SshLaunch``: the hosts of ``--hostfile``; ``SlurmLaunch``: one Slurm job (submitit);
- ``KubernetesLaunch``: manifests (``--emit``), run by Kubernetes with ``--apply``.

Healing (``--restarts N``) is the same for every job that can restart: the newest checkpoint of
a round every device logged is resumed, and whatever later rounds left is deleted first.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

from esync.common import runlayout
from esync.common.errors import UsageError
from esync.common.files import atomic_write_text
from esync.common.procs import free_port, port_is_free
from esync.launch.backends.base import Backend
from esync.launch.backends.local import LocalBackend
from esync.launch.backends.netns import NetnsBackend, layout_from_args
from esync.launch.flags import device_list, worker_argv
from esync.launch.remote import node_devices
from esync.launch.roles import (HOROVOD_CYCLE_MS, REPO, ClusterConfig, Hosts, device_names,
                                plan_roles)
from esync.launch.supervisor import Options

LOCAL_ADDRESS = "127.0.0.1"       # the local backend's one host


class Launch:
    """What every job shares: the plan, restarts, the state server's view, the end report."""

    emulation = "sleep"           # how slow-downs are emulated; LocalLaunch may cap CPUs
    cpu_share: float | None = None
    cfs_slice_us: int | None = None   # the kernel's CFS bandwidth slice the caps ran with

    def __init__(self, args, parser, *, hosts: Hosts, devices: list[str]):
        self.args, self.parser = args, parser
        self.mode_dir = runlayout.mode_dir(args)
        self.proc_dir = runlayout.processes_dir(self.mode_dir)
        self.devices, self.hosts = list(devices), hosts
        self.uses_state_server = args.mode == "esync" and not args.local_iters
        self.token = args.state_token or secrets.token_urlsafe(24)
        self.config = self.configure(resume=args.resume, overwrite=args.overwrite)

    # -- what a subclass fills in
    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        """The plan's input for a start (``resume``: a restart from the last checkpoint)."""
        raise NotImplementedError

    def backend(self) -> Backend:
        raise NotImplementedError

    # -- shared
    def config_with(self, port: int, state_port: int | None, *, resume: bool, overwrite: bool,
                    **paths) -> ClusterConfig:
        a = self.args
        return ClusterConfig(
            mode=a.mode, devices=tuple(self.devices), slowdowns=tuple(a.slowdowns), port=port,
            train_argv=tuple(worker_argv(self.parser, a, resume=resume, overwrite=overwrite)),
            servers=a.servers, threads=a.threads, evaluator=not a.no_evaluator,
            state_port=state_port if self.uses_state_server else None,
            state_token=self.token, emulation=self.emulation,
            cpu_cores=tuple(self.cpu_cores()), cpu_pins=tuple(self.cpu_pins()),
            speed_schedule=a.speed_schedule,
            collective=a.collective, local_iters=tuple(a.local_iters),
            horovod_cycle_ms=os.environ.get("HOROVOD_CYCLE_TIME", HOROVOD_CYCLE_MS),
            state_db=paths.pop("state_db", str(runlayout.state_db(self.mode_dir))), **paths)

    def plan(self):
        return plan_roles(self.config, self.hosts)

    def cpu_cores(self) -> list[float | None]:
        """Each worker's CPU cap in cores (None: uncapped; a GPU worker sleeps instead)."""
        if self.cpu_share is None:
            return [None] * len(self.devices)
        return [self.cpu_share / f if d == "cpu" else None
                for d, f in zip(self.devices, self.args.slowdowns)]

    def cpu_pins(self) -> list[int | None]:
        """The CPU each capped worker computes on (``cgroups.place_on_cpus``); None: not pinned
        (uncapped, or ``--no-cpu-pinning``)."""
        cores = self.cpu_cores()
        if getattr(self.args, "no_cpu_pinning", False) or all(c is None for c in cores):
            return [None] * len(cores)
        from esync.launch.cgroups import place_on_cpus
        return place_on_cpus(cores, os.sched_getaffinity(0))

    def placement(self) -> list[dict]:
        """Which device trains on which shard, where, how slow: worker i of the plan holds
        shard i in every run, whatever rank ps-lite gives it."""
        classes = shard_classes(self.args, len(self.devices))
        return [{"device": name, "host": host.name, "shard": i, "classes": classes[i],
                 "slowdown": factor, "cpu_cores": cores, "cpu": cpu}
                for i, (name, host, factor, cores, cpu) in enumerate(zip(
                    device_names(self.devices), self.hosts.workers, self.args.slowdowns,
                    self.cpu_cores(), self.cpu_pins()))]

    def on_ps_host(self, fn, *args):
        """``fn(*args)`` from where the launcher reaches the ps host (here, for remote hosts)."""
        return fn(*args)

    def prepare(self) -> bool:
        """Everything before the processes start; False: nothing is to run (only files)."""
        self.mode_dir.mkdir(parents=True, exist_ok=True)
        spec = {k: v for k, v in vars(self.args).items()
                if isinstance(v, (str, int, float, bool, list, type(None))) and k != "state_token"}
        spec.update(emulation=self.emulation, cpu_share=self.cpu_share,
                    cfs_slice_us=self.cfs_slice_us, placement=self.placement())
        atomic_write_text(runlayout.cluster_file(self.mode_dir), json.dumps(spec, indent=1))
        return True

    def supervision(self, options: Options) -> Options:
        """The supervisor's options for this job (a job whose logs are remote changes them)."""
        return options

    def finish(self, code: int) -> None:
        """After a run that ended well: the summary and the final accuracy."""
        if code != 0:
            return
        if not self.args.no_summary:
            _write_summary(self.mode_dir)
        log = runlayout.EvaluationLog(runlayout.evaluations_file(self.mode_dir))
        acc = log.poll()
        print(f"esync-cluster: done; logs in {self.mode_dir}"
              + (f"; final test accuracy {acc:.4f}" if acc is not None else ""))

    def restart_plan(self, attempt: int):
        """Make the folder ready to resume from the last checkpoint; the plan that does it.

        The checkpoint resumed from is the newest one of a round that every device has logged:
        rank 0 writes a round's checkpoint before a slower worker writes that round's log, so
        the newest checkpoint may be a round that a killed worker never logged. Everything after
        the chosen round (device logs, checkpoints, their scores) is deleted and run again, so
        every round is logged once. With no such checkpoint the job starts over.
        """
        from esync.worker.checkpoint import CheckpointError, CheckpointStore
        store = CheckpointStore(runlayout.checkpoints_dir(self.mode_dir))
        logged = rounds_logged_by_all(self.mode_dir, device_names(self.config.devices))
        try:
            found = store.latest(network=self.args.network, at_most=logged)
        except CheckpointError as exc:
            raise RuntimeError(str(exc)) from None
        if found is None:
            print("esync-cluster: no checkpoint of a round every device logged; starting the "
                  "job over", file=sys.stderr)
            return self._replan(resume=False, overwrite=True)
        done = int(found[1]["round"])
        forget_rounds_after(self.mode_dir, store, done)
        store.clear_done()
        print(f"esync-cluster: resuming from {found[0].name} (round {done})", file=sys.stderr)
        return self._replan(resume=True, overwrite=False)

    def _replan(self, *, resume: bool, overwrite: bool):
        try:
            self.config = self.configure(resume=resume, overwrite=overwrite)
        except UsageError as exc:           # e.g. a fixed --port taken meanwhile
            raise RuntimeError(str(exc)) from None
        return self.plan()

    def state_view(self) -> str:
        """The state server's view of every worker (for a stall report), or why there is none."""
        from esync.coordination.client import StateClient, StateServerError
        url = f"http://{self.hosts.ps.address}:{self.config.state_port}"

        def ask():
            with StateClient(url, job=self.args.job, token=self.token, timeout=3.0,
                             retry_for=0.0) as client:
                return client.state()
        try:
            view = self.on_ps_host(ask)
        except (StateServerError, OSError) as exc:
            return f"  (no answer from {url}: {exc})"
        return _format_view(view)




class LocalLaunch(Launch):
    """Processes on this machine: on loopback, or in emulated hosts (``--net netns``)."""

    def __init__(self, args, parser, backend: Backend | None = None, hosts: Hosts | None = None,
                 *, cpu_share: float | None = None):
        self._backend = backend or LocalBackend()
        self.cpu_share = cpu_share
        self.emulation = "sleep" if cpu_share is None else "cpu-cap"
        hosts = hosts or Hosts.single(args.host_name, LOCAL_ADDRESS, args.workers)
        super().__init__(args, parser, hosts=hosts, devices=device_list(args.devices,
                                                                         args.workers))

    @classmethod
    def create(cls, args, parser) -> "LocalLaunch":
        """--net netns builds the emulated hosts now (clearing what dead launchers left first);
        CPU caps make a cgroup per capped device (clearing what dead launchers left first).
        The supervisor's close() of the backend removes both on every way out."""
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
        from esync.common.speeds import parse_speed_schedule
        from esync.launch.cgroups import SpeedShifter
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


class SshLaunch(Launch):
    """The hosts of ``--hostfile``, reached over ssh; the first runs the ps-side roles."""

    def __init__(self, args, parser):
        from esync.launch.backends import ssh
        self.lines = ssh.read_hostfile(args.hostfile)
        hosts, devices = ssh.placement(self.lines)
        self.ssh = ssh.Ssh(args.ssh_config, tuple(args.ssh_option))
        self.python = args.remote_python or sys.executable
        self.repo = args.remote_repo or str(REPO)
        self.targets = {line.address: line.target for line in self.lines}
        ssh.check_hosts(self.ssh, self.lines, Path(args.log_dir), Path(args.data_dir),
                        self.python, self.repo)
        super().__init__(args, parser, hosts=hosts, devices=devices)

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        from esync.launch.backends import ssh
        port, state = self.args.port, self.args.state_port
        if not (port and state):
            free = ssh.free_ports(self.ssh, self.lines[0].target, self.python)
            port, state = port or free[0], state or free[1]
        main_py = str(Path(self.repo) / "main.py")
        return self.config_with(port, state, resume=resume, overwrite=overwrite,
                                python=self.python, main_py=main_py)

    def backend(self):
        from esync.launch.backends import ssh
        return ssh.SshBackend(self.targets, self.ssh, python=self.python, repo=self.repo)


class SlurmLaunch(Launch):
    """One Slurm job (submitit) of ``--nodes`` nodes; its roles start inside the job."""

    def __init__(self, args, parser):
        from esync.launch.backends import slurm
        per_node = node_devices(args.node_devices)
        hosts, devices = slurm.placement(args.nodes, per_node)
        gpus = args.gpus_per_node
        if gpus is None:
            gpus = len({d for d in per_node if d.startswith("gpu")})
        extra = {}
        for option in args.slurm_option:
            key, sep, value = option.partition("=")
            if not sep or not key:
                raise UsageError(f"--slurm-option {option!r}: use KEY=VALUE (an sbatch option "
                                 "without its dashes, e.g. account=lab)")
            extra[key] = value
        self.options = dict(partition=args.partition, gpus_per_node=gpus,
                            minutes=args.slurm_minutes, extra=extra)
        super().__init__(args, parser, hosts=hosts, devices=devices)

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        # 0: derived from the job id inside the job (the nodes are not known before).
        return self.config_with(self.args.port or 0, self.args.state_port or 0,
                                resume=resume, overwrite=overwrite)

    def backend(self):
        from esync.launch.backends import slurm
        return slurm.SlurmBackend(lambda: self.config, self.args.nodes, **self.options)

    def state_view(self) -> str:
        return f"  (the state server runs inside the Slurm job; see {self.proc_dir}/state-server.log)"


class KubernetesLaunch(Launch):
    """Writes the manifests; with ``--apply`` runs them, else ``emit_only`` is True."""

    def __init__(self, args, parser):
        from esync.launch.backends import kubernetes as k8s
        devices = device_list(args.devices, args.workers)
        # What the pods see: the image's paths and the volume, not this machine's (a copy:
        # the launcher's own flags stay as given).
        pods = argparse.Namespace(**{**vars(args), "log_dir": k8s.LOG_DIR,
                                     "data_dir": k8s.DATA_DIR})
        if getattr(pods, "tensorboard", None):
            pods.tensorboard = str(runlayout.mode_dir(pods))     # on the volume, by the logs
        super().__init__(pods, parser, hosts=k8s.placement(args.k8s_name, devices),
                         devices=devices)
        self.manifests = k8s.Manifests(
            args.k8s_name, plan_roles(self.config, self.hosts), image=args.image,
            token=self.token, threads=args.threads, volume_size=args.volume_size,
            storage_class=args.storage_class, namespace=args.namespace)
        self.emit_only = not args.apply

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        from esync.launch.backends import kubernetes as k8s
        return self.config_with(k8s.SCHEDULER_PORT, k8s.STATE_PORT, resume=resume,
                                overwrite=overwrite, python="python",
                                main_py=f"{k8s.APP_DIR}/main.py")

    def restart_plan(self, attempt: int):
        raise RuntimeError("a Kubernetes job is restarted by Kubernetes, not by esync-cluster")

    def prepare(self) -> bool:
        """Write the manifests (and with --apply check that a cluster answers)."""
        from esync.launch.backends.kubernetes import KUBERNETES_VERSION
        written = self.emit()
        print(f"esync-cluster: wrote {len(written)} manifests and a Dockerfile to "
              f"{self.args.emit} (Kubernetes {KUBERNETES_VERSION})")
        return not self.emit_only

    def supervision(self, options: Options) -> Options:
        # The logs are on the cluster's volume: rounds cannot be watched from here.
        options.stall_timeout = options.startup_timeout = float("inf")
        return options

    def finish(self, code: int) -> None:
        if code == 0:
            print(f"esync-cluster: done; the logs are on the volume {self.args.k8s_name}-logs")

    def emit(self) -> list[Path]:
        """Write the manifests; with --apply, then make sure a cluster answers."""
        from esync.launch.backends import kubernetes as k8s
        written = self.manifests.write(Path(self.args.emit), REPO)
        if self.args.apply:
            k8s.check_cluster(Path(self.args.emit))
        return written

    def backend(self):
        from esync.launch.backends import kubernetes as k8s
        return k8s.KubernetesBackend(self.manifests, Path(self.args.emit), REPO)

    def state_view(self) -> str:
        return f"  (see kubectl logs {self.args.k8s_name}-ps -c state-server)"


LAUNCHES = {"local": LocalLaunch.create, "ssh": SshLaunch, "slurm": SlurmLaunch, "kubernetes": KubernetesLaunch}


def make_launch(args, parser) -> Launch:
    """The job of ``--backend``."""
    return LAUNCHES[args.backend](args, parser)


def cpu_caps(args):
    """(CpuCaps, share) when CPU workers are emulated by caps, else (None, None).

    ``--emulation auto`` falls back to sleeping, with one warning, where cgroups are out of
    reach (not root, no cpu controller); ``cpu-cap`` then is an error. The default share is the
    most that fits every device's cap (at its fastest, over a speed schedule) and a reserve for
    the parameter server, scheduler, evaluator and state server into this machine's cores.
    """
    import os
    from esync.common.speeds import parse_speed_schedule
    from esync.launch.cgroups import CgroupError, CgroupsUnavailable, CpuCaps, default_share
    devices = device_list(args.devices, args.workers)
    if args.emulation == "sleep" or "cpu" not in devices:
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


def shard_classes(args, workers: int) -> list[list[int] | None]:
    """The classes of each shard for by-class splits (-s 1, -s 2); None for i.i.d. shards or
    where the labels cannot be read here (remote data)."""
    if not args.split_by_class:
        return [None] * workers
    try:
        from esync.worker.data import FASHION_FILES, FASHION_SUBDIR, read_idx, training_shard
        labels = read_idx(Path(args.data_dir) / FASHION_SUBDIR / FASHION_FILES["train"][1])
        return [sorted({int(c) for c in labels[training_shard(labels, workers, i,
                                                                args.split_by_class,
                                                                seed=args.seed)[0]]})
                for i in range(workers)]
    except (OSError, ValueError):
        return [None] * workers


def rounds_logged_by_all(mode_dir: Path, devices) -> int:
    """The last round R such that every device has logged rounds 1..R (0: none)."""
    rounds: dict[str, set[int]] = {}
    for _, device, round_no, _ in runlayout.device_round_logs(mode_dir):
        rounds.setdefault(device, set()).add(round_no)
    complete = []
    for device in devices:
        have, r = rounds.get(device, set()), 0
        while r + 1 in have:
            r += 1
        complete.append(r)
    return min(complete, default=0)


def forget_rounds_after(mode_dir: Path, store, done: int) -> None:
    """Delete what rounds after ``done`` left (device logs, checkpoints, scores): they run again."""
    for _, _, round_no, log in runlayout.device_round_logs(mode_dir):
        if round_no > done:
            log.unlink()
    for path in store.list():
        if store.round_of(path) > done:
            path.unlink()
    scores = runlayout.evaluations_file(mode_dir)
    if scores.exists():
        kept = []
        for line in scores.read_text().splitlines():
            try:
                if int(json.loads(line)["round"]) > done:
                    continue
            except (ValueError, KeyError, TypeError):
                pass
            kept.append(line)
        atomic_write_text(scores, "".join(f"{line}\n" for line in kept))


def _format_view(view) -> str:
    lines = []
    for key, value in (view.items() if isinstance(view, dict) else [("state", view)]):
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"  {key}:")
            lines += [f"    {json.dumps(v, sort_keys=True)}" for v in value]
        elif isinstance(value, dict) and value and all(isinstance(v, dict)
                                                       for v in value.values()):
            lines.append(f"  {key}:")
            lines += [f"    {k}: {json.dumps(v, sort_keys=True)}" for k, v in value.items()]
        else:
            lines.append(f"  {key}: {json.dumps(value)}")
    return "\n".join(lines)


def _write_summary(mode_dir: Path) -> None:
    from esync.analysis.summary import LogError, write_summary
    try:
        path = write_summary(mode_dir)
        print(f"esync-cluster: summary written to {path}")
    except LogError as exc:
        print(f"esync-cluster: no summary: {exc}", file=sys.stderr)


