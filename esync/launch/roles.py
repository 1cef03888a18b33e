"""The role plan: which processes a job needs, with which command and environment, on which host.

``plan_roles(config, hosts)`` is pure: it starts nothing and reads nothing, so every backend
(local processes, network namespaces, ssh, Slurm, Kubernetes) starts exactly the same roles, and
a test can check the plan without a cluster. Addresses come only from the placement it is given:
the scheduler, parameter servers, state server and evaluator run on ``hosts.ps``; worker i runs
on ``hosts.workers[i]``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from esync.common.modes import ASYNCHRONOUS_CLI
from esync.common.procs import python_env
from esync.common.speeds import CPU_PIN_ENV
from esync.emulation.cgroups import ONE_COMPUTE_THREAD_ENV
from esync.launch.resources import CUDA_VISIBLE_DEVICES, NO_GPU, gpu_index, visible_devices

REPO = Path(__file__).resolve().parents[2]

MAIN = REPO / "main.py"

KINDS = ("state", "scheduler", "server", "rendezvous", "evaluator", "worker")


@dataclass(frozen=True)
class RoleSpec:
    """One process of the job.

    ``argv`` is the whole command, starting with this machine's Python (a backend running it on
    another host may put that host's interpreter in its place); it runs from the repository's
    folder. ``env`` holds only what the role adds to a clean environment (``DMLC_*``,
    ``OMP_NUM_THREADS``, ``ESYNC_*``...). ``host`` is the name of the host in the placement, also
    the ``<host>`` folder of a worker's logs; ``device`` is a worker's device name and log folder
    (``cpuN``, ``gpuN``, or ``gpuN-M`` for the M-th worker sharing GPU N). ``rank`` is a worker's
    index in the plan (ps-lite numbers workers by itself; the log shows its rank).
    """
    name: str
    kind: str            # scheduler | server | rendezvous | state | evaluator | worker
    argv: list[str]
    env: dict[str, str]
    host: str
    device: str = ""
    rank: int | None = None
    cpu_cores: float | None = None   # a worker's CPU cap in cores (emulated device); None: none

    @property
    def gpu(self) -> int | None:
        """The GPU index of a GPU worker (its user's name: gpuN), else None."""
        return gpu_index(self.device)


@dataclass(frozen=True)
class Host:
    """An emulated or real machine: ``name`` (log folder), ``address`` (how others reach it) and,
    when a machine has several interfaces, the one ps-lite must use."""
    name: str
    address: str
    interface: str = ""


@dataclass(frozen=True)
class Hosts:
    """Placement: ``ps`` holds scheduler, servers, state server and evaluator; one host per worker
    (several workers may name the same host)."""
    ps: Host
    workers: tuple[Host, ...]

    @classmethod
    def single(cls, name: str, address: str, workers: int) -> "Hosts":
        """Every role on one machine (the local backend)."""
        host = Host(name, address)
        return cls(ps=host, workers=(host,) * workers)


@dataclass(frozen=True)
class ClusterConfig:
    """What the plan needs to know of the job (the launcher builds it from its flags).

    ``train_argv`` are the ``main.py`` training flags shared by every worker and the evaluator;
    the plan adds each worker's device, slow-down, shard, host name and the state server's
    address. ``cpu_cores`` (one per worker; None: uncapped) are the CPU caps that emulate the
    slow-downs under ``emulation="cpu-cap"``; worker i always trains on shard i.
    ``worker_threads`` (one per worker; empty: ``threads`` each) are the workers'
    OMP_NUM_THREADS (``esync.launch.resources.worker_threads``); ``evaluator_gpu`` is the GPU
    the evaluator scores on (None: the CPU).
    """
    mode: str
    devices: tuple[str, ...]               # one per worker: "cpu" or "gpuN"
    slowdowns: tuple[float, ...]           # one per worker, >= 1
    port: int                              # the ps-lite scheduler's (or the rendezvous') port
    train_argv: tuple[str, ...] = ()
    servers: int = 1
    threads: int = 1
    worker_threads: tuple[int, ...] = ()
    evaluator: bool = True
    evaluator_gpu: int | None = None
    state_port: int | None = None          # None: no state server (not ESync, or --local-iters)
    state_token: str = ""
    state_db: str = ""                     # the state server's SQLite file
    emulation: str = "sleep"               # how slow-downs are emulated: sleep | cpu-cap
    cpu_cores: tuple[float | None, ...] = ()
    cpu_pins: tuple[int | None, ...] = ()  # the CPU each capped worker computes on (None: any)
    speed_schedule: str | None = None      # --speed-schedule, passed to every worker
    collective: str = "ps"                 # ps: scheduler + servers; allreduce: a rendezvous
    local_iters: tuple[int, ...] = ()      # ESync's fixed k of each worker (--local-iters)
    horovod_cycle_ms: str = "20"           # allreduce workers' HOROVOD_CYCLE_TIME (see below)
    python: str = field(default=sys.executable)
    main_py: str = field(default=str(MAIN))

    @property
    def workers(self) -> int:
        return len(self.devices)


def device_names(devices) -> list[str]:
    """cpu0, cpu1, ... for CPU workers; gpuN, or gpuN-2 when two workers share a GPU."""
    names, seen, cpus = [], {}, 0
    for d in devices:
        if d == "cpu":
            names.append(f"cpu{cpus}")
            cpus += 1
        else:
            seen[d] = seen.get(d, 0) + 1
            names.append(d if seen[d] == 1 else f"{d}-{seen[d]}")
    return names


def plan_roles(config: ClusterConfig, hosts: Hosts) -> list[RoleSpec]:
    """Every process of the job in start order: state server, scheduler and servers (or, over
    the allreduce, Horovod's rendezvous), evaluator, workers."""
    if len(hosts.workers) != config.workers:
        raise ValueError(f"placement has {len(hosts.workers)} worker hosts for "
                         f"{config.workers} workers")
    if len(config.slowdowns) != config.workers:
        raise ValueError(f"{len(config.slowdowns)} slow-down factors for {config.workers} workers")
    ps = hosts.ps
    main = [config.python, config.main_py]
    specs = []
    if config.state_port is not None:
        specs.append(RoleSpec(
            "state-server", "state",
            [config.python, "-m", "esync.coordination.service", "--host", ps.address,
             "--port", str(config.state_port)],
            {**python_env(), "ESYNC_STATE_TOKEN": config.state_token,
             "ESYNC_STATE_DB": config.state_db, CUDA_VISIBLE_DEVICES: NO_GPU}, ps.name))
    allreduce = config.collective == "allreduce"
    slots = slot_plan([h.name for h in hosts.workers]) if allreduce else []
    if allreduce:
        specs.append(RoleSpec(
            "rendezvous", "rendezvous",
            [config.python, "-m", "esync.launch.rendezvous", "--host", ps.address,
             "--port", str(config.port), "--workers", ",".join(h.name for h in hosts.workers)],
            {**python_env(), CUDA_VISIBLE_DEVICES: NO_GPU}, ps.name))
    else:
        specs.append(RoleSpec("scheduler", "scheduler", list(main),
                              _dmlc_env(config, ps, ps, "scheduler"), ps.name))
        for i in range(config.servers):
            specs.append(RoleSpec(f"server{i}", "server", list(main),
                                  _dmlc_env(config, ps, ps, "server"), ps.name))
    train = list(config.train_argv)
    state = []
    if config.state_port is not None:
        state = ["--state-server-ip", ps.address, "--state-server-port", str(config.state_port)]
    if config.evaluator:
        gpu = config.evaluator_gpu
        env = {**python_env(), "DMLC_ROLE": "evaluator",
               "OMP_NUM_THREADS": str(config.threads),
               CUDA_VISIBLE_DEVICES: NO_GPU if gpu is None else str(gpu)}
        if config.state_port is not None:
            env["ESYNC_STATE_TOKEN"] = config.state_token     # it posts scores to the dashboard
        on = [] if gpu is None else ["-c", "0", "-g", "0"]
        specs.append(RoleSpec("evaluator", "evaluator", main + train + on + state, env, ps.name))
    names = device_names(config.devices)
    writer = checkpoint_writer(config.slowdowns)
    for i, (device, name, factor, host) in enumerate(zip(config.devices, names,
                                                           config.slowdowns, hosts.workers)):
        env = (_horovod_env(config, ps, host, slots[i]) if allreduce
               else _dmlc_env(config, ps, host, "worker"))
        if config.worker_threads:
            env["OMP_NUM_THREADS"] = str(config.worker_threads[i])
        env[CUDA_VISIBLE_DEVICES] = visible_devices(device)
        if config.state_port is not None:
            env["ESYNC_STATE_TOKEN"] = config.state_token
        # A GPU worker sees its own GPU alone, as gpu(0); --device-name keeps the user's name.
        on = ["-c", "1"] if device == "cpu" else ["-c", "0", "-g", "0"]
        cores = config.cpu_cores[i] if config.cpu_cores else None
        if cores is not None:
            env.update(ONE_COMPUTE_THREAD_ENV)   # the quota throttles one thread smoothly
            pin = config.cpu_pins[i] if config.cpu_pins else None
            if pin is not None:
                env[CPU_PIN_ENV] = str(pin)
        emulation = ["--emulation", "cpu-cap"] if cores is not None else []
        schedule = ["--speed-schedule", config.speed_schedule] if config.speed_schedule else []
        argv = main + train + on + ["--device-name", name, "--slowdown", f"{factor:g}",
                                    "--shard", str(i), "--host-name", host.name] \
            + emulation + schedule + state
        if config.local_iters:
            argv += ["--local-iters", str(config.local_iters[i])]
        if config.mode == ASYNCHRONOUS_CLI:
            argv += ["--writes-checkpoints" if i == writer else "--no-writes-checkpoints"]
        specs.append(RoleSpec(f"worker-{name}", "worker", argv, env, host.name, device=name,
                              rank=i, cpu_cores=cores))
    return specs


def checkpoint_writer(slowdowns) -> int:
    """The worker that writes the checkpoints in an asynchronous mode: the fastest device (the
    first of the fastest), whose rounds end most often. Each async worker's rounds are its own,
    so rank 0 (ps-lite's pick) being a slow device would leave the evaluator one checkpoint per
    slow iteration; in round modes every rank's rounds end together and rank 0 writes them."""
    return min(range(len(slowdowns)), key=lambda i: slowdowns[i])


def coordination_roles(*, collective: str, servers: int, state_server: bool,
                       evaluator: bool) -> int:
    """How many roles other than workers ``plan_roles`` starts (for a backend that must size
    the job before it plans it, e.g. Slurm's tasks per node)."""
    return (1 if collective == "allreduce" else 1 + servers) + int(state_server) + int(evaluator)


def slot_plan(worker_hosts: list[str]) -> list[dict]:
    """Horovod's slot of each worker, worker i being rank i: its local rank counts the earlier
    workers on its host; its cross rank numbers the hosts holding that local rank, in order of
    their first worker."""
    hosts = list(dict.fromkeys(worker_hosts))
    per_host = {h: worker_hosts.count(h) for h in hosts}
    slots, seen = [], {}
    for rank, host in enumerate(worker_hosts):
        local = seen.get(host, 0)
        seen[host] = local + 1
        crossing = [h for h in hosts if per_host[h] > local]
        slots.append(dict(hostname=host, rank=rank, local_rank=local, cross_rank=crossing.index(host),
                          size=len(worker_hosts), local_size=per_host[host],
                          cross_size=len(crossing)))
    return slots


def slot_env(slot: dict, rendezvous_address: str, rendezvous_port: int,
             interface: str = "") -> dict[str, str]:
    """What ``horovodrun --gloo`` gives a worker: its slot, the rendezvous, Gloo as controller
    and for CPU operations, and the interface to bind (else the worker picks the one routing
    to the rendezvous: ``esync.common.netif.choose_gloo_interface``)."""
    env = {"HOROVOD_HOSTNAME": slot["hostname"], "HOROVOD_RANK": str(slot["rank"]),
           "HOROVOD_SIZE": str(slot["size"]), "HOROVOD_LOCAL_RANK": str(slot["local_rank"]),
           "HOROVOD_LOCAL_SIZE": str(slot["local_size"]),
           "HOROVOD_CROSS_RANK": str(slot["cross_rank"]),
           "HOROVOD_CROSS_SIZE": str(slot["cross_size"]),
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_address,
           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
           "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
    if interface:
        env["HOROVOD_GLOO_IFACE"] = interface
    return env


# Horovod's background loop wakes every HOROVOD_CYCLE_TIME ms and coordinates with the other
# ranks even when nothing is queued: at its default an idle worker used about 0.18 of a core
# here (more than a x8 device's whole cap of 0.08), at 20 ms about 0.02-0.04. ESync exchanges
# once per round (hundreds of ms or more), so 20 ms of added latency is small; the launcher
# passes the user's own value from its environment instead (ClusterConfig.horovod_cycle_ms).
HOROVOD_CYCLE_MS = "20"


def _horovod_env(config: ClusterConfig, ps: Host, host: Host, slot: dict) -> dict[str, str]:
    interface = host.interface or ("lo" if host.address.startswith("127.") else "")
    return {**python_env(), "OMP_NUM_THREADS": str(config.threads),
            "MXNET_CPU_WORKER_NTHREADS": "1",
            "HOROVOD_CYCLE_TIME": config.horovod_cycle_ms,
            **slot_env(slot, ps.address, config.port, interface)}


def _dmlc_env(config: ClusterConfig, ps: Host, host: Host, role: str) -> dict[str, str]:
    env = {**python_env(), "DMLC_ROLE": role,
           "DMLC_PS_ROOT_URI": ps.address, "DMLC_PS_ROOT_PORT": str(config.port),
           "DMLC_NUM_SERVER": str(config.servers), "DMLC_NUM_WORKER": str(config.workers),
           "DMLC_NODE_HOST": host.address, "OMP_NUM_THREADS": str(config.threads),
           "MXNET_CPU_WORKER_NTHREADS": "1", CUDA_VISIBLE_DEVICES: NO_GPU}
    if host.interface:
        env["DMLC_INTERFACE"] = host.interface
    return env
