"""esync-cluster beyond this machine: the ``--backend`` flags and the job of each backend.

    esync-cluster --backend ssh --hostfile hosts.txt -ld /shared/logs
    esync-cluster --backend slurm --nodes 2 --node-devices gpu0,gpu1 --gpus-per-node 2
    esync-cluster --backend kubernetes --emit k8s/ --devices gpu0,gpu1,cpu --image REG/esync:1

Every backend starts the same roles from the same pure plan (``plan_roles``) and is watched by
the same supervisor; what differs is where the roles run (the placement), how ports are chosen
and which backend starts them. ``prepare`` turns the backend's flags into the usual
``--workers``/``--devices`` before the launcher's checks; ``make_cluster`` returns the job.
"""
from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from esync import cli
from esync.errors import UsageError
from esync.launch.plan import REPO, ClusterConfig, Hosts, plan_roles

BACKENDS = ("local", "ssh", "slurm", "kubernetes")
PLACED = {"ssh": "--hostfile", "slurm": "--nodes and --node-devices"}


def add_arguments(parser: argparse.ArgumentParser) -> set[str]:
    """The backend flags; returns their dests (launcher-only: never passed to main.py)."""
    g = parser.add_argument_group("where the job runs (--backend)")
    g.add_argument("--backend", choices=BACKENDS, default="local",
                   help="local: processes on this machine; ssh: hosts of --hostfile; slurm: one "
                        "Slurm job (submitit); kubernetes: manifests (--emit, --apply)")
    s = parser.add_argument_group("ssh backend")
    s.add_argument("--hostfile", help="one host per line: ADDRESS DEVICE,DEVICE,... (e.g. "
                                      "'10.1.1.29 gpu0,gpu1,cpu'); the first also runs the "
                                      "scheduler, server(s), state server and evaluator")
    s.add_argument("--ssh-config", help="ssh configuration file (ssh -F) for every connection")
    s.add_argument("--ssh-option", action="append", default=[], metavar="OPTION",
                   help="an ssh -o option for every connection (repeatable)")
    s.add_argument("--remote-python", help="Python on the hosts; default: this machine's")
    s.add_argument("--remote-repo", help="the repository on the hosts; default: this machine's")
    m = parser.add_argument_group("slurm backend")
    m.add_argument("--partition", help="Slurm partition; default: the cluster's default one")
    m.add_argument("--nodes", type=cli._positive_int, default=1, help="nodes of the job")
    m.add_argument("--node-devices", default="cpu",
                   help="the devices of each node that get a worker, e.g. gpu0,gpu1,cpu")
    m.add_argument("--gpus-per-node", type=cli._non_negative_int, default=None,
                   help="GPUs to allocate per node; default: the GPUs --node-devices names")
    m.add_argument("--time", dest="slurm_minutes", type=cli._positive_int, default=60,
                   help="the job's time limit in minutes")
    m.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other sbatch option, e.g. account=lab (repeatable)")
    k = parser.add_argument_group("kubernetes backend")
    k.add_argument("--emit", metavar="DIR", help="write the manifests and Dockerfile here")
    k.add_argument("--apply", action="store_true",
                   help="also kubectl apply them and watch the job (needs a cluster)")
    k.add_argument("--image", default="esync:latest", help="the image every pod runs")
    k.add_argument("--k8s-name", default="esync", help="name of the job's objects")
    k.add_argument("--namespace", help="namespace of the objects; default: kubectl's current one")
    k.add_argument("--volume-size", default="10Gi", help="size of the shared log volume")
    k.add_argument("--storage-class", help="storage class of the log volume (ReadWriteMany)")
    return {"backend", "hostfile", "ssh_config", "ssh_option", "remote_python", "remote_repo",
            "partition", "nodes", "node_devices", "gpus_per_node", "slurm_minutes",
            "slurm_option", "emit", "apply", "image", "k8s_name", "namespace", "volume_size",
            "storage_class"}


def prepare(args, argv: list[str]) -> None:
    """Check the backend flags; set ``args.workers``/``args.devices`` from the placement."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if args.backend in PLACED and given & {"--workers", "--devices"}:
        raise UsageError(f"--backend {args.backend} places workers by {PLACED[args.backend]}: "
                         "leave out --workers and --devices")
    if args.backend == "ssh":
        from esync.launch.backends import ssh
        if not args.hostfile:
            raise UsageError("--backend ssh needs --hostfile FILE (one 'ADDRESS DEVICES' line "
                             "per host)")
        devices = ssh.placement(ssh.read_hostfile(args.hostfile))[1]
    elif args.backend == "slurm":
        from esync.launch.backends import slurm  # noqa: F401 (fails early without submitit)
        devices = _devices("--node-devices", args.node_devices) * args.nodes
    elif args.backend == "kubernetes":
        from esync.launch.backends import kubernetes
        if not args.emit:
            raise UsageError("--backend kubernetes needs --emit DIR (where the manifests go)")
        kubernetes.check_name(args.k8s_name)
        return
    else:
        foreign = sorted(given & {"--hostfile", "--emit", "--apply", "--node-devices", "--nodes"})
        if foreign:
            raise UsageError(f"{foreign[0]} belongs to another backend: add --backend")
        return
    args.workers, args.devices = len(devices), ",".join(devices)
    if args.slowdown_list is None:
        args.slowdown_list = "1"


def _devices(flag: str, text: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    for item in items:
        if item != "cpu" and not (item.startswith("gpu") and item[3:].isdigit()):
            raise UsageError(f"argument {flag}: {item!r} is not 'cpu' or 'gpuN'")
    return items


def make_cluster(args, parser, local_cls):
    """The job of ``args.backend`` (``local_cls`` is the launcher's local job class)."""
    kinds = {"ssh": SshJob, "slurm": SlurmJob, "kubernetes": KubernetesJob}
    if args.backend not in kinds:
        return local_cls(args, parser)
    return kinds[args.backend].create(local_cls, args, parser)


class _RemoteMixin:
    """What every remote job shares with the local one, but placement, ports and backend."""

    @classmethod
    def create(cls, local_cls, args, parser):
        """An instance of this job on top of the launcher's local job class, whose restart
        (resume from the last checkpoint) and plan methods it keeps."""
        job_cls = type(cls.__name__, (cls, local_cls), {})
        return job_cls(args, parser)

    def _setup(self, args, parser, hosts: Hosts, devices: list[str]):
        from esync.launch import _mode_dir
        self.args, self.parser = args, parser
        self.mode_dir = _mode_dir(args)
        self.proc_dir = self.mode_dir / "processes"
        self.devices, self.hosts = devices, hosts
        self.uses_state_server = args.mode == "esync" and not args.local_iters
        self.token = args.state_token or secrets.token_urlsafe(24)

    def config_with(self, port: int, state_port: int | None, **paths) -> ClusterConfig:
        from esync.launch import worker_argv
        a = self.args
        return ClusterConfig(
            mode=a.mode, devices=tuple(self.devices), slowdowns=tuple(a.slowdowns), port=port,
            train_argv=tuple(worker_argv(self.parser, a)), servers=a.servers, threads=a.threads,
            evaluator=not a.no_evaluator,
            state_port=state_port if self.uses_state_server else None,
            state_token=self.token,
            state_db=paths.get("state_db", str(self.mode_dir / "state_server.sqlite3")),
            **{k: v for k, v in paths.items() if k != "state_db"})


class SshJob(_RemoteMixin):
    def __init__(self, args, parser):
        from esync.launch.backends import ssh
        self.lines = ssh.read_hostfile(args.hostfile)
        hosts, devices = ssh.placement(self.lines)
        self._setup(args, parser, hosts, devices)
        self.ssh = ssh.Ssh(args.ssh_config, tuple(args.ssh_option))
        self.python = args.remote_python or sys.executable
        self.repo = args.remote_repo or str(REPO)
        self.targets = {line.address: line.target for line in self.lines}
        ssh.check_hosts(self.ssh, self.lines, Path(args.log_dir), Path(args.data_dir),
                        self.python, self.repo)
        self.config = self.configure(resume=args.resume, overwrite=args.overwrite)

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        from esync.launch.backends import ssh
        port, state = self.args.port, self.args.state_port
        if not (port and state):
            free = ssh.free_ports(self.ssh, self.lines[0].target, self.python)
            port, state = port or free[0], state or free[1]
        self.args.resume, self.args.overwrite = resume, overwrite
        main_py = str(Path(self.repo) / "main.py")
        return self.config_with(port, state, python=self.python, main_py=main_py)

    def backend(self):
        from esync.launch.backends import ssh
        return ssh.SshBackend(self.targets, self.ssh, python=self.python, repo=self.repo)


class SlurmJob(_RemoteMixin):
    def __init__(self, args, parser):
        from esync.launch.backends import slurm
        node_devices = _devices("--node-devices", args.node_devices)
        hosts, devices = slurm.placement(args.nodes, node_devices)
        self._setup(args, parser, hosts, devices)
        gpus = args.gpus_per_node
        if gpus is None:
            gpus = len({d for d in node_devices if d.startswith("gpu")})
        extra = {}
        for option in args.slurm_option:
            key, sep, value = option.partition("=")
            if not sep or not key:
                raise UsageError(f"--slurm-option {option!r}: use KEY=VALUE (an sbatch option "
                                 "without its dashes, e.g. account=lab)")
            extra[key] = value
        self.options = dict(partition=args.partition, gpus_per_node=gpus,
                            minutes=args.slurm_minutes, extra=extra)
        self.config = self.configure(resume=args.resume, overwrite=args.overwrite)

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        # 0: derived from the job id inside the job (the nodes are not known before).
        self.args.resume, self.args.overwrite = resume, overwrite
        return self.config_with(self.args.port or 0, self.args.state_port or 0)

    def backend(self):
        from esync.launch.backends import slurm
        return slurm.SlurmBackend(lambda: self.config, self.args.nodes, **self.options)

    def state_view(self) -> str:
        return "  (the state server runs inside the Slurm job; see processes/state-server.log)"


class KubernetesJob(_RemoteMixin):
    """Writes the manifests; with ``--apply`` runs them, else ``emit_only`` is True."""

    def __init__(self, args, parser):
        from esync.launch import _device_list
        from esync.launch.backends import kubernetes as k8s
        devices = _device_list(args.devices, args.workers)
        # What the pods see: the image's paths and the volume, not this machine's.
        args.log_dir, args.data_dir = k8s.LOG_DIR, k8s.DATA_DIR
        self._setup(args, parser, k8s.placement(args.k8s_name, devices), devices)
        self.config = self.config_with(
            k8s.SCHEDULER_PORT, k8s.STATE_PORT, python="python",
            main_py=f"{k8s.APP_DIR}/main.py",
            state_db=str(self.mode_dir / "state_server.sqlite3"))
        self.manifests = k8s.Manifests(
            args.k8s_name, plan_roles(self.config, self.hosts), image=args.image,
            token=self.token, threads=args.threads, volume_size=args.volume_size,
            storage_class=args.storage_class, namespace=args.namespace)
        self.emit_only = not args.apply

    def emit(self) -> list[Path]:
        """Write the manifests; with --apply, then make sure a cluster answers."""
        from esync.launch.backends import kubernetes as k8s
        written = self.manifests.write(Path(self.args.emit), REPO)
        if self.args.apply:
            k8s.check_cluster(Path(self.args.emit))
        return written

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        raise RuntimeError("a Kubernetes job is restarted by Kubernetes, not by esync-cluster")

    def backend(self):
        from esync.launch.backends import kubernetes as k8s
        return k8s.KubernetesBackend(self.manifests, Path(self.args.emit), REPO)

    def state_view(self) -> str:
        return f"  (see kubectl logs {self.args.k8s_name}-ps -c state-server)"


def kubernetes_version() -> str:
    from esync.launch.backends.kubernetes import KUBERNETES_VERSION
    return KUBERNETES_VERSION
