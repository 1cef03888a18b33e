"""What every job of esync-cluster shares: the ``Launch`` interface ``main`` sees, and the restarts.

A ``Launch`` holds the resolved flags (never changed), the hosts and devices of its placement, and
its ``ClusterConfig`` (the plan's input: immutable, rebuilt only when a restart picks new ports).
``main`` sees only this interface; each backend's subclass lives with the backend's flags and
runner in ``esync/launch/backends/<name>.py`` (``LocalLaunch``, ``SshLaunch``, ``SlurmLaunch``,
``KubernetesLaunch``), and ``esync.launch.remote`` picks one by ``--backend``.

Healing (``--restarts N``) is the same for every job that can restart: the newest checkpoint of
a round every device logged is resumed, and whatever later rounds left is deleted first.
"""
from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

from esync.common import runlayout
from esync.common.errors import UsageError
from esync.common.files import atomic_write_text
from esync.emulation.schedules import parse_speed_schedule
from esync.launch.backends.base import Backend
from esync.launch.resources import emulates_devices, visible_devices, worker_threads
from esync.launch.roles import HOROVOD_CYCLE_MS, ClusterConfig, Hosts, device_names, plan_roles
from esync.launch.supervisor import Options


def planned_devices(args) -> list[str]:
    """One device per worker, as ``--devices`` and ``--workers`` give them."""
    # Read from flags.py when called, not at load: flags.py builds its parser from the
    # backends' flag groups, and every backend's launch builds on this module.
    from esync.launch.flags import device_list
    return device_list(args.devices, args.workers)


def emulates(args) -> bool:
    """Whether this run emulates slow devices (``esync.launch.resources.emulates_devices``):
    only then do CPU caps, pinning and one compute thread per worker apply."""
    schedule = parse_speed_schedule(args.speed_schedule) if args.speed_schedule else {}
    return emulates_devices(args.slowdowns, emulation=args.emulation,
                            schedule_factors=[f for steps in schedule.values() for _, f in steps])


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
        self.emulated = emulates(args)
        self.uses_state_server = args.mode == "esync" and not args.local_iters
        self.token = args.state_token or secrets.token_urlsafe(24)
        self.config = self.configure(resume=args.resume, overwrite=args.overwrite)

    # -- what a subclass fills in
    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        """The plan's input for a start (``resume``: a restart from the last checkpoint)."""
        raise NotImplementedError

    def backend(self) -> Backend:
        raise NotImplementedError

    def machines(self) -> tuple[list[str], dict[str, int], str]:
        """For ``worker_threads``: the machine each worker runs on, the cores of each machine
        known here, and the machine of the coordination roles. Here each host is a machine of
        unknown size (nothing is divided)."""
        return [host.name for host in self.hosts.workers], {}, self.hosts.ps.name

    def evaluator_gpu(self) -> int | None:
        """The GPU the evaluator scores on (None: the CPU); a backend that knows of a GPU
        no worker uses on the coordination roles' machine gives it."""
        return None

    # -- shared
    def worker_threads(self) -> list[int]:
        """Each worker's OMP_NUM_THREADS: ``--threads``, else the rule of
        ``esync.launch.resources.worker_threads`` (one each when devices are emulated)."""
        machines, cores, ps_machine = self.machines()
        return worker_threads(self.devices, machines, cores, given=self.args.threads,
                              emulated=self.emulated, coordination_machine=ps_machine)

    def config_with(self, port: int, state_port: int | None, *, resume: bool, overwrite: bool,
                    **paths) -> ClusterConfig:
        from esync.launch.flags import worker_argv      # at call time: see planned_devices
        a = self.args
        return ClusterConfig(
            mode=a.mode, devices=tuple(self.devices), slowdowns=tuple(a.slowdowns), port=port,
            train_argv=tuple(worker_argv(self.parser, a, resume=resume, overwrite=overwrite)),
            servers=a.servers, threads=a.threads or 1,
            worker_threads=tuple(self.worker_threads()), evaluator=not a.no_evaluator,
            evaluator_gpu=None if a.no_evaluator else self.evaluator_gpu(),
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
        from esync.emulation.cgroups import place_on_cpus
        return place_on_cpus(cores, os.sched_getaffinity(0))

    def placement(self) -> list[dict]:
        """Which device trains on which shard, where, how slow: worker i of the plan holds
        shard i in every run, whatever rank ps-lite gives it."""
        classes = shard_classes(self.args, len(self.devices))
        return [{"device": name, "host": host.name, "shard": i, "classes": classes[i],
                 "slowdown": factor, "cpu_cores": cores, "cpu": cpu, "threads": threads,
                 "cuda_visible_devices": visible_devices(device)}
                for i, (device, name, host, factor, cores, cpu, threads) in enumerate(zip(
                    self.devices, device_names(self.devices), self.hosts.workers,
                    self.args.slowdowns, self.cpu_cores(), self.cpu_pins(),
                    self.config.worker_threads))]

    def resources(self) -> dict:
        """What the run gives its processes, as data (for ``--explain`` and cluster.json):
        whether devices are emulated, and each worker's threads, CPU cap, pinned CPU and
        visible GPU (``placement``), and the evaluator's GPU."""
        return {"emulated_devices": self.emulated, "emulation": self.emulation,
                "evaluator_gpu": self.config.evaluator_gpu, "workers": self.placement()}

    def on_ps_host(self, fn, *args):
        """``fn(*args)`` from where the launcher reaches the ps host (here, for remote hosts)."""
        return fn(*args)

    def prepare(self) -> bool:
        """Everything before the processes start; False: nothing is to run (only files)."""
        self.mode_dir.mkdir(parents=True, exist_ok=True)
        spec = {k: v for k, v in vars(self.args).items()
                if isinstance(v, (str, int, float, bool, list, type(None))) and k != "state_token"}
        spec.update(emulation=self.emulation, cpu_share=self.cpu_share,
                    cfs_slice_us=self.cfs_slice_us, placement=self.placement(),
                    emulated_devices=self.emulated, evaluator_gpu=self.config.evaluator_gpu)
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
        from esync.common.checkpoint import CheckpointError, CheckpointStore
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


def shard_classes(args, workers: int) -> list[list[int] | None]:
    """The classes of each shard for by-class splits (-s 1, -s 2); None for i.i.d. shards or
    where the labels cannot be read here (remote data)."""
    if not args.split_by_class:
        return [None] * workers
    try:
        from esync.common.catalog import FASHION_FILES, FASHION_SUBDIR
        from esync.common.dataset import read_idx, training_shard
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
