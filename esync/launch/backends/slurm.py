"""The whole job as one Slurm job, submitted with submitit.

    esync-cluster --backend slurm --partition gpu --nodes 2 --node-devices gpu0,gpu1,cpu \\
        --gpus-per-node 2 --time 60 -ld /shared/esync-logs

One ``sbatch`` job of ``--nodes`` nodes and the same number of tasks on each; every task takes
its role from ``SLURM_PROCID`` (tasks are laid out in blocks: node k holds tasks k*T..k*T+T-1).
Node 0 runs the state server, the scheduler, the parameter server(s), the evaluator and its
workers; every other node runs its workers (and, when node 0 needs more tasks than it has
devices, as many idle tasks that end at once). Node addresses are only known once the job runs,
so each task recomputes the same pure plan (``plan_roles``) with the real nodes:
``DMLC_PS_ROOT_URI`` is the first node's address. Without ``--port`` the ports are derived from
the job id, identical in every task.

GPUs: the job asks each node for as many GPUs as ``--node-devices`` names distinct ones
(``--gpus-per-node`` for more), as ``--gpus-per-node=N`` or ``--gres=gpu:N``
(``--gpu-request``). Slurm chooses which GPUs, so a ``gpuN`` name labels one of them: the
distinct names, in numeric order, take the allocation's GPUs in the order of the task's
``CUDA_VISIBLE_DEVICES`` (``gpu_slots``); each GPU worker sees that one GPU alone. Every task
asks for the same CPUs (``cpus_per_task``): ``--threads``, else the node's CPUs divided among
its tasks, and at least two with GPU workers.

Roles run under ``esync.launch.runner``: each role's output goes to ``processes/<role>.log`` of
the shared log folder, its exit code to ``processes/<role>.exit``, and the launcher stops a role
by creating ``processes/<role>.stop``. ``scancel`` (or Ctrl-C in the launcher, which calls it)
ends every task; the launcher notices a job that ended under it and names the roles it cut off.

A job that waits for a reason that cannot clear as long as the job stays as submitted (it asks
for more than the partition's nodes have, a limit of its QOS, an account it may not use...; see
``NEVER_STARTS``) is cancelled at once and reported with what to change, instead of being
announced as pending for ever.
"""
from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from esync.common.argtypes import non_negative_int, positive_int
from esync.common.errors import UsageError
from esync.launch.backends.base import Backend, Handle
from esync.launch.launches import Launch
from esync.launch.resources import (CUDA_VISIBLE_DEVICES, GPU_WORKER_THREADS, NO_GPU, gpu_index,
                                    within)
from esync.launch.roles import (REPO, ClusterConfig, Host, Hosts, RoleSpec, coordination_roles,
                                plan_roles)
from esync.launch.runner import read_exit, run

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}
PORT_BASE, PORT_SPAN = 20000, 40000
STATE_POLL = 2.0          # seconds between squeue calls

# Pending reasons (squeue %r, Slurm 22.05) that cannot clear for the job as submitted, each with
# what to change. Transient ones (Resources, Priority, BeginTime, Dependency, None, the Grp*,
# *PerUser and *PerAccount limits that other jobs' ending lifts...) are not here: the job waits.
NEVER_STARTS = {
    "PartitionConfig": "the job asks for more CPUs (tasks x --threads), GPUs, memory or nodes "
                       "than the partition's nodes have: lower --node-devices, --threads, "
                       "--gpus-per-node or --nodes, or raise the node's CPUs (Gres, RealMemory) "
                       "in slurm.conf",
    "PartitionNodeLimit": "--nodes is outside the partition's node limits (MinNodes/MaxNodes, "
                          "or its nodes are down or drained): lower --nodes or choose another "
                          "--partition",
    "PartitionTimeLimit": "--time exceeds the partition's MaxTime: lower --time or choose "
                          "another --partition",
    "ReqNodeNotAvail": "the partition has fewer usable nodes than --nodes (the others are down, "
                       "drained or failing): lower --nodes, choose another --partition, or ask "
                       "the administrator to resume the nodes (scontrol update nodename=... "
                       "state=resume)",
    "BadConstraints": "no node can satisfy the job's constraints: drop or fix --slurm-option "
                      "constraint=...",
    "InvalidAccount": "the account is invalid or not yours: fix --slurm-option account=... "
                      "(sacctmgr show assoc user=$USER lists yours)",
    "AccountNotAllowed": "the partition does not accept this account: choose another "
                         "--partition or --slurm-option account=...",
    "InvalidQOS": "the QOS is invalid for this account or partition: fix or drop --slurm-option "
                  "qos=...",
    "QOSNotAllowed": "the partition does not accept this QOS: choose another --partition or "
                     "--slurm-option qos=...",
    "MaxMemPerLimit": "the job asks for more memory per node or CPU than the partition allows "
                      "(MaxMemPerNode/MaxMemPerCPU): lower --slurm-option mem=... or choose "
                      "another --partition",
    "DependencyNeverSatisfied": "a job it depends on failed or was cancelled: drop or fix "
                                "--slurm-option dependency=...",
    "ReservationDeleted": "its reservation was deleted: drop or fix --slurm-option "
                          "reservation=...",
    "ReservationInvalid": "its reservation is invalid: drop or fix --slurm-option "
                          "reservation=...",
    "QOSMax*PerJob": "the job asks for more (CPUs, nodes, GPUs, memory, time) than its QOS "
                     "allows one job: lower --nodes, --node-devices, --threads, --gpus-per-node "
                     "or --time, or ask for another QOS (--slurm-option qos=...)",
    "QOSMax*PerNode": "the job asks for more per node than its QOS allows: lower "
                      "--node-devices, --threads or --gpus-per-node, or ask for another QOS "
                      "(--slurm-option qos=...)",
    "QOSMin*": "the job asks for less than its QOS's minimum: ask for another QOS "
               "(--slurm-option qos=...) or raise --nodes or --threads",
    "AssocMax*PerJob": "the job asks for more (CPUs, nodes, GPUs, memory, time) than your "
                       "association allows one job: lower --nodes, --node-devices, --threads, "
                       "--gpus-per-node or --time, or use another --slurm-option account=...",
    "AssocMax*PerNode": "the job asks for more per node than your association allows: lower "
                        "--node-devices, --threads or --gpus-per-node, or use another "
                        "--slurm-option account=...",
}
# Reason codes that name a kind of limit (QOSMaxCpuPerJobLimit, AssocMaxNodePerJobLimit...):
# the NEVER_STARTS key each belongs to.
_LIMIT_KINDS = [(re.compile(r"QOSMax\w+PerJob(Limit)?"), "QOSMax*PerJob"),
                (re.compile(r"QOSMax\w+PerNode(Limit)?"), "QOSMax*PerNode"),
                (re.compile(r"QOSMin\w+"), "QOSMin*"),
                (re.compile(r"AssocMax\w+PerJob(Limit)?"), "AssocMax*PerJob"),
                (re.compile(r"AssocMax\w+PerNode(Limit)?"), "AssocMax*PerNode")]
# Node states (sinfo %T, without its flag suffixes) in which a node takes no new job until an
# administrator acts.
DEAD_NODE_STATES = {"down", "drain", "drained", "draining", "fail", "failing", "inval", "future"}


def reason_code(reason: str) -> str:
    """The code of squeue's reason ("ReqNodeNotAvail, UnavailableNodes:n1" -> "ReqNodeNotAvail");
    a free-text description Slurm shows instead of a code is returned as it is."""
    return reason.split(",", 1)[0].strip()


def never_starts(reason: str, *, usable_nodes: int | None = None, nodes: int = 1) -> str | None:
    """What to change when a job pending for `reason` can never start as submitted, else None.

    ReqNodeNotAvail is also said while a node is merely busy or reserved: it is final only when
    the partition has fewer ``usable_nodes`` (not down, drained or failing) than the job's
    ``nodes``; without that count it is taken as transient.
    """
    code = reason_code(reason)
    if code == "ReqNodeNotAvail":
        return NEVER_STARTS[code] if usable_nodes is not None and usable_nodes < nodes else None
    if code in NEVER_STARTS and "*" not in code:
        return NEVER_STARTS[code]
    for pattern, kind in _LIMIT_KINDS:
        if pattern.fullmatch(code):
            return NEVER_STARTS[kind]
    return None


def usable_node_count(sinfo_lines: str) -> int:
    """Distinct nodes of ``sinfo -h -N -o '%N|%T'`` output that can take a new job."""
    usable = set()
    for line in sinfo_lines.splitlines():
        name, _, state = line.strip().partition("|")
        words = {w.rstrip("*~#!%$@^-") for w in state.lower().split("+")}
        if name and state and not words & DEAD_NODE_STATES:
            usable.add(name)
    return len(usable)


def placement(nodes: int, node_devices: list[str]) -> tuple[Hosts, list[str]]:
    """Submission-time placement on node indices (``node0``...); addresses come in the job."""
    hosts = [Host(f"node{i}", f"node{i}") for i in range(nodes)]
    workers = tuple(hosts[i] for i in range(nodes) for _ in node_devices)
    return Hosts(ps=hosts[0], workers=workers), list(node_devices) * nodes


# The flags ----------------------------------------------------------------------------------

PLACED_BY = "--nodes and --node-devices"     # what places the workers
GPU_REQUESTS = ("gpus-per-node", "gres")     # the sbatch forms of a GPU request


def add_arguments(parser) -> set[str]:
    """The Slurm backend's flags; returns their dests (launcher-only: never passed to main.py)."""
    m = parser.add_argument_group("slurm backend")
    m.add_argument("--partition", help="Slurm partition; default: the cluster's default one")
    m.add_argument("--nodes", type=positive_int, default=1, help="nodes of the job")
    m.add_argument("--node-devices", default="cpu",
                   help="the devices of each node that get a worker, e.g. gpu0,gpu1,cpu")
    m.add_argument("--gpus-per-node", type=non_negative_int, default=None,
                   help="GPUs to allocate per node; default: as many as --node-devices names "
                        "distinct GPUs (gpuN names label the node's allocated GPUs: the "
                        "distinct names, in numeric order, take them in Slurm's order)")
    m.add_argument("--gpu-request", choices=GPU_REQUESTS, default="gpus-per-node",
                   help="how the job asks for its GPUs: sbatch --gpus-per-node=N, or "
                        "--gres=gpu:N where the cluster knows GPUs only as generic resources")
    m.add_argument("--time", dest="slurm_minutes", type=positive_int, default=60,
                   help="the job's time limit in minutes")
    m.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other sbatch option, e.g. account=lab (repeatable)")
    return {"partition", "nodes", "node_devices", "gpus_per_node", "gpu_request",
            "slurm_minutes", "slurm_option"}


def node_devices(text: str, flag: str = "--node-devices") -> list[str]:
    """The devices of one node (``--node-devices``): cpu or gpuN, comma-separated."""
    items = [t.strip() for t in text.split(",")]
    for item in items:
        if item != "cpu" and not (item.startswith("gpu") and item[3:].isdigit()):
            raise UsageError(f"argument {flag}: {item!r} is not 'cpu' or 'gpuN'")
    return items


def placed_devices(args) -> list[str]:
    """Every node's devices, node after node."""
    return node_devices(args.node_devices) * args.nodes


# GPUs and CPUs of a task ----------------------------------------------------------------------

def gpu_slots(devices) -> dict[int, int]:
    """Each GPU name's place among a node's allocated GPUs: Slurm chooses which GPUs a job
    gets, so ``gpuN`` labels one of them; the distinct names, in numeric order, take the
    allocation's GPUs in its order (``gpu1`` alone takes the first, ``gpu0,gpu2`` the first
    two), and as many GPUs are asked for as there are distinct names."""
    indices = sorted({i for i in map(gpu_index, devices) if i is not None})
    return {index: slot for slot, index in enumerate(indices)}


def task_gpu(visible: str, slots: dict[int, int], allocated: str | None) -> str:
    """A task's ``CUDA_VISIBLE_DEVICES``: the plan's GPU name (``visible``, "" for none)
    turned into the GPU of the allocation (``allocated``: what Slurm set for the task)."""
    if not visible:
        return visible
    return within(str(slots[int(visible)]), allocated)


def cpus_per_task(*, threads: int | None, gpus: bool, emulated: bool, node_cpus: int | None,
                  tasks: int) -> int:
    """The CPUs of every task (sbatch gives all tasks the same): ``--threads`` if given, else
    one each while devices are emulated, else the node's CPUs divided among its tasks; with
    GPU workers at least ``GPU_WORKER_THREADS`` (their Python, engine and ps-lite threads)."""
    least = GPU_WORKER_THREADS if gpus else 1
    if threads is not None:
        return max(threads, least)
    if emulated or not node_cpus:
        return least
    return max(least, node_cpus // tasks)


def gpu_parameters(gpus: int, form: str) -> dict:
    """submitit's parameters asking each node for `gpus` GPUs in the cluster's `form`."""
    if not gpus:
        return {}
    return {"slurm_gres": f"gpu:{gpus}"} if form == "gres" else {"slurm_gpus_per_node": gpus}


def node_cpu_count(partition: str | None) -> int | None:
    """The CPUs of the partition's smallest node (``sinfo``), or None where Slurm says nothing."""
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%c", *(["-p", partition] if partition
                                                             else [])],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    counts = [int(c) for c in done.stdout.split() if c.isdigit()]
    return min(counts) if done.returncode == 0 and counts else None


def task_layout(specs: list[RoleSpec], nodes: int) -> list[list[str | None]]:
    """Role names per node, padded to one task count: ``layout[node][local task]``."""
    per_node = [[s.name for s in specs if s.host == f"node{i}"] for i in range(nodes)]
    tasks = max(len(names) for names in per_node)
    return [names + [None] * (tasks - len(names)) for names in per_node]


def job_ports(config: ClusterConfig, job_id: str) -> ClusterConfig:
    """Ports every task derives alike from the job id, unless the user fixed them."""
    base = PORT_BASE + (int(job_id.split("_")[0]) * 2) % PORT_SPAN
    port = config.port or base
    state = config.state_port
    if state == 0:
        state = base + 1 if base + 1 != port else base + 2
    return dataclasses.replace(config, port=port, state_port=state)


def node_hosts() -> list[Host]:
    """This job's nodes in Slurm's order, by name and address."""
    names = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                           capture_output=True, text=True, check=True).stdout.split()
    return [Host(name, socket.gethostbyname(name)) for name in names]


def run_task(config: ClusterConfig, layout: list[list[str | None]], proc_dir: str) -> int:
    """One Slurm task (what submitit runs on a node): run the role SLURM_PROCID stands for."""
    procid, node = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NODEID"])
    tasks = len(layout[0])
    if procid // tasks != node:
        raise RuntimeError(f"task {procid} runs on node {node}, not {procid // tasks}: the job "
                           "needs block distribution of tasks")
    name = layout[node][procid % tasks]
    if name is None:
        return 0                                    # padding: node 0 needs more tasks
    nodes = node_hosts()
    hosts = Hosts(ps=nodes[0], workers=tuple(nodes[int(h[4:])] for h in _worker_nodes(layout)))
    config = job_ports(config, os.environ["SLURM_JOB_ID"])
    spec = next(s for s in plan_roles(config, hosts) if s.name == name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    env.update(spec.env)
    env[CUDA_VISIBLE_DEVICES] = task_gpu(spec.env.get(CUDA_VISIBLE_DEVICES, NO_GPU),
                                         gpu_slots(config.devices),
                                         os.environ.get(CUDA_VISIBLE_DEVICES))
    folder = Path(proc_dir)
    code = run(spec.argv, log=folder / f"{name}.log", env=env, cwd=str(REPO),
               exit_file=folder / f"{name}.exit", stop_file=folder / f"{name}.stop")
    return code


def _worker_nodes(layout) -> list[str]:
    """`nodeK` of each worker, in plan order (workers are named worker-*)."""
    return [f"node{k}" for k, names in enumerate(layout)
            for name in names if name and name.startswith("worker-")]


class SlurmJob:
    """The submitted job: its state (from squeue, refreshed at most every STATE_POLL s)."""

    def __init__(self, job_id: str, env: dict | None = None):
        self.id = job_id
        self.env = env
        self._state, self._reason, self._partition, self._at = "PENDING", "", "", 0.0
        self.polls = 0                                # squeue answers read so far

    def state(self, fresh: bool = False) -> str:
        if self._state in ACTIVE and (fresh or time.monotonic() - self._at > STATE_POLL):
            self._at = time.monotonic()
            done = subprocess.run(["squeue", "-h", "-t", "all", "-j", self.id, "-o", "%T|%P|%r"],
                                  capture_output=True, text=True)
            line = done.stdout.strip()
            if done.returncode == 0 and line:
                self._state, self._partition, self._reason = (line.split("|", 2) + ["", ""])[:3]
                self.polls += 1
            elif done.returncode != 0 and "Invalid job id" not in done.stderr:
                return self._state                    # slurmctld busy: ask again later
            else:
                self._state = "ENDED"                 # gone from the queue: ended a while ago
        return self._state

    @property
    def reason(self) -> str:
        return self._reason

    def never_starts(self, nodes: int) -> str | None:
        """What to change if the job, pending for its current reason, can never start."""
        usable = None
        if reason_code(self._reason) == "ReqNodeNotAvail" and self._partition:
            done = subprocess.run(["sinfo", "-h", "-N", "-p", self._partition, "-o", "%N|%T"],
                                  capture_output=True, text=True)
            if done.returncode == 0:
                usable = usable_node_count(done.stdout)
        return never_starts(self._reason, usable_nodes=usable, nodes=nodes)

    def node_names(self) -> list[str]:
        """The job's nodes in Slurm's order (once it runs)."""
        nodelist = subprocess.run(["squeue", "-h", "-j", self.id, "-o", "%N"],
                                  capture_output=True, text=True).stdout.strip()
        return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                              text=True).stdout.split() if nodelist else []

    def cancel(self) -> None:
        subprocess.run(["scancel", self.id], capture_output=True)


class SlurmHandle(Handle):
    def __init__(self, spec: RoleSpec, job: SlurmJob, proc_dir: Path):
        super().__init__(spec)
        self.job, self.proc_dir = job, proc_dir
        self.log_path = proc_dir / f"{spec.name}.log"

    def poll(self) -> int | None:
        code = read_exit(self.proc_dir / f"{self.name}.exit")
        if code is not None:
            return code
        if self.job.state() in ACTIVE:
            return None
        # The job ended without this role's exit code: cancelled, timed out or its node died.
        time.sleep(1.0)                       # an exit file written a moment before the end
        code = read_exit(self.proc_dir / f"{self.name}.exit")
        return code if code is not None else 1

    def terminate(self, hard: bool = False) -> None:
        if self.poll() is not None:
            return
        if hard:
            self.job.cancel()
        else:
            (self.proc_dir / f"{self.name}.stop").touch()

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = "(no log: the role did not start)"
        text = "\n".join(text.splitlines()[-lines:])
        state, deadline = self.job.state(fresh=True), time.monotonic() + 10
        while state == "COMPLETING" and time.monotonic() < deadline:   # its final state soon
            time.sleep(0.5)
            state = self.job.state(fresh=True)
        if state != "RUNNING":           # cancelled (scancel), timed out, a node failed...
            text += f"\n(Slurm job {self.job.id} is {state})"
        return text

    def describe(self) -> str:
        return f"Slurm job {self.job.id}, {self.job.state().lower()}"

    @property
    def log(self) -> str:
        return str(self.log_path)


class SlurmBackend(Backend):
    """Submits every role at once as one job; ``start`` returns once the job runs."""

    def __init__(self, config_of: Callable[[], ClusterConfig], nodes: int, *,
                 partition: str | None = None, gpus_per_node: int = 0,
                 gpu_request: str = "gpus-per-node", cpus_per_task: int = 1, minutes: int = 60,
                 job_name: str = "esync", extra: dict | None = None, announce=None):
        # The job's current config (a restart resumes from a checkpoint: other flags).
        self.config_of, self.nodes = config_of, nodes
        self.params = dict(slurm_partition=partition, slurm_time=minutes, nodes=nodes,
                           slurm_job_name=job_name, cpus_per_task=cpus_per_task,
                           slurm_srun_args=["--distribution=block"],
                           slurm_additional_parameters={"chdir": str(REPO), **(extra or {})})
        self.params.update(gpu_parameters(gpus_per_node, gpu_request))
        self.announce = announce or (lambda text: print(text, file=sys.stderr, flush=True))
        self.job: SlurmJob | None = None
        self._tasks = 0                          # tasks per node of the job submitted last

    def start(self, specs: list[RoleSpec], proc_dir: Path) -> list[Handle]:
        if self.job is not None:
            if len(specs) == 1:
                raise NotImplementedError("a Slurm job cannot restart one of its roles in place")
            self.close()                         # a whole-cluster restart: a new job
        import submitit
        proc_dir = Path(proc_dir)
        proc_dir.mkdir(parents=True, exist_ok=True)
        for spec in specs:                       # files of an earlier attempt
            for suffix in (".exit", ".stop"):
                (proc_dir / f"{spec.name}{suffix}").unlink(missing_ok=True)
        layout = task_layout(specs, self.nodes)
        self._tasks = len(layout[0])
        self.job_folder = proc_dir / "slurm"
        executor = submitit.SlurmExecutor(folder=self.job_folder, max_num_timeout=0)
        params = {k: v for k, v in self.params.items() if v is not None}
        executor.update_parameters(ntasks_per_node=len(layout[0]),
                                   **{k.removeprefix("slurm_"): v for k, v in params.items()})
        try:
            submitted = executor.submit(run_task, self.config_of(), layout, str(proc_dir))
        except Exception as exc:             # sbatch refused: bad partition, too many nodes...
            raise UsageError(f"--backend slurm: sbatch refused the job: {_first_line(exc)}") \
                from None
        self.job = SlurmJob(str(submitted.job_id))
        self.announce(f"esync-cluster: Slurm job {self.job.id}: {self.nodes} node(s) x "
                      f"{len(layout[0])} tasks; its files are in {proc_dir / 'slurm'}")
        try:
            self._wait_until_running()
        except BaseException:
            self.close()
            raise
        # Worker logs go to <log dir>/.../<node's name>/<device>: the supervisor looks there.
        names = self.job.node_names()
        named = [dataclasses.replace(s, host=names[int(s.host[4:])])
                 if s.host.startswith("node") and s.host[4:].isdigit()
                 and int(s.host[4:]) < len(names) else s for s in specs]
        return [SlurmHandle(spec, self.job, proc_dir) for spec in named]

    def _wait_until_running(self) -> None:
        last, checked = 0.0, 0
        while (state := self.job.state()) == "PENDING":
            if self.job.polls != checked:        # a fresh reason: one that never clears ends here
                checked = self.job.polls
                fix = self.job.never_starts(self.nodes)
                if fix is not None:
                    self.job.cancel()
                    raise UsageError(f"--backend slurm: Slurm job {self.job.id} can never start "
                                     f"(pending: {reason_code(self.job.reason)}; "
                                     f"{self._request()}): {fix}; the job is cancelled")
            if time.monotonic() - last > 30:
                last = time.monotonic()
                reason = self.job.reason if self.job.reason not in ("", "None") else "queued"
                self.announce(f"esync-cluster: Slurm job {self.job.id} is pending ({reason})")
            time.sleep(0.5)
        if state not in ACTIVE:
            raise RuntimeError(f"Slurm job {self.job.id} ended before it ran ({state}); see "
                               f"its files in {self.job_folder}")

    def _request(self) -> str:
        """What the job asks each node for, as sbatch was told."""
        tasks, cpus = self._tasks, self.params["cpus_per_task"]
        text = (f"it asks for {self.nodes} node(s) x {tasks} task(s) x {cpus} CPU(s) = "
                f"{tasks * cpus} CPUs per node")
        if self.params.get("slurm_gpus_per_node"):
            text += f" and {self.params['slurm_gpus_per_node']} GPU(s) per node"
        if self.params.get("slurm_gres"):
            text += f" and --gres={self.params['slurm_gres']} per node"
        return text + f", for {self.params['slurm_time']} min"

    def close(self) -> None:
        if self.job is None or self.job.state() not in ACTIVE:
            return
        self.job.cancel()
        deadline = time.monotonic() + 60
        while self.job.state() in ACTIVE and time.monotonic() < deadline:
            time.sleep(0.5)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__


# The launch ----------------------------------------------------------------------------------

class SlurmLaunch(Launch):
    """One Slurm job (submitit) of ``--nodes`` nodes; its roles start inside the job."""

    def __init__(self, args, parser):
        per_node = node_devices(args.node_devices)
        hosts, devices = placement(args.nodes, per_node)
        named = len(gpu_slots(per_node))
        gpus = named if args.gpus_per_node is None else args.gpus_per_node
        if gpus < named:
            raise UsageError(f"--gpus-per-node {gpus}: --node-devices names {named} distinct "
                             "GPUs, each a GPU of the allocation; ask for at least as many")
        self.node_cpus = node_cpu_count(args.partition)
        extra = {}
        for option in args.slurm_option:
            key, sep, value = option.partition("=")
            if not sep or not key:
                raise UsageError(f"--slurm-option {option!r}: use KEY=VALUE (an sbatch option "
                                 "without its dashes, e.g. account=lab)")
            extra[key] = value
        self.options = dict(partition=args.partition, gpus_per_node=gpus,
                            gpu_request=args.gpu_request, minutes=args.slurm_minutes,
                            extra=extra)
        super().__init__(args, parser, hosts=hosts, devices=devices)

    def cpus_per_task(self) -> int:
        """The CPUs each task of the job asks for (``cpus_per_task``)."""
        a = self.args
        tasks = len(node_devices(a.node_devices)) + coordination_roles(
            collective=a.collective, servers=a.servers, state_server=self.uses_state_server,
            evaluator=not a.no_evaluator)
        return cpus_per_task(threads=a.threads, gpus=bool(gpu_slots(self.devices)),
                             emulated=self.emulated, node_cpus=self.node_cpus, tasks=tasks)

    def worker_threads(self) -> list[int]:
        """``--threads``, else one while devices are emulated, else the task's CPUs."""
        if self.args.threads is not None or self.emulated:
            return super().worker_threads()
        return [self.cpus_per_task()] * len(self.devices)

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        # 0: derived from the job id inside the job (the nodes are not known before).
        return self.config_with(self.args.port or 0, self.args.state_port or 0,
                                resume=resume, overwrite=overwrite)

    def backend(self):
        return SlurmBackend(lambda: self.config, self.args.nodes,
                            cpus_per_task=self.cpus_per_task(), **self.options)

    def state_view(self) -> str:
        return (f"  (the state server runs inside the Slurm job; see "
                f"{self.proc_dir}/state-server.log)")


if __name__ == "__main__":      # pragma: no cover - not a command
    sys.exit("esync.launch.backends.slurm is used by esync-cluster --backend slurm")
