"""esync-cluster beyond this machine: the ``--backend`` flags.

    esync-cluster --backend ssh --hostfile hosts.txt -ld /shared/logs
    esync-cluster --backend slurm --nodes 2 --node-devices gpu0,gpu1 --gpus-per-node 2
    esync-cluster --backend kubernetes --emit k8s/ --devices gpu0,gpu1,cpu --image REG/esync:1

Every backend starts the same roles from the same pure plan (``plan_roles``) and is watched by
the same supervisor; what differs is where the roles run (the placement), how ports are chosen
and which backend starts them (``esync.launch.jobs``). ``placed_devices`` turns the backend's
flags into the usual ``--workers``/``--devices`` while the command line is parsed.
"""
from __future__ import annotations

import argparse

from esync.common.argtypes import non_negative_int, positive_int
from esync.common.errors import UsageError

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
    m.add_argument("--nodes", type=positive_int, default=1, help="nodes of the job")
    m.add_argument("--node-devices", default="cpu",
                   help="the devices of each node that get a worker, e.g. gpu0,gpu1,cpu")
    m.add_argument("--gpus-per-node", type=non_negative_int, default=None,
                   help="GPUs to allocate per node; default: the GPUs --node-devices names")
    m.add_argument("--time", dest="slurm_minutes", type=positive_int, default=60,
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


def placed_devices(args, argv: list[str]) -> list[str] | None:
    """Check the backend flags; the devices ssh and Slurm place (None: --workers/--devices)."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if args.backend in PLACED and given & {"--workers", "--devices"}:
        raise UsageError(f"--backend {args.backend} places workers by {PLACED[args.backend]}: "
                         "leave out --workers and --devices")
    if args.backend == "ssh":
        from esync.launch.backends import ssh
        if not args.hostfile:
            raise UsageError("--backend ssh needs --hostfile FILE (one 'ADDRESS DEVICES' line "
                             "per host)")
        return ssh.placement(ssh.read_hostfile(args.hostfile))[1]
    if args.backend == "slurm":
        from esync.launch.backends import slurm  # noqa: F401 (fails early without submitit)
        return node_devices(args.node_devices) * args.nodes
    if args.backend == "kubernetes":
        from esync.launch.backends import kubernetes
        if not args.emit:
            raise UsageError("--backend kubernetes needs --emit DIR (where the manifests go)")
        kubernetes.check_name(args.k8s_name)
        return None
    foreign = sorted(given & {"--hostfile", "--emit", "--apply", "--node-devices", "--nodes"})
    if foreign:
        raise UsageError(f"{foreign[0]} belongs to another backend: add --backend")
    return None


def node_devices(text: str, flag: str = "--node-devices") -> list[str]:
    """The devices of one node (``--node-devices``): cpu or gpuN, comma-separated."""
    items = [t.strip() for t in text.split(",")]
    for item in items:
        if item != "cpu" and not (item.startswith("gpu") and item[3:].isdigit()):
            raise UsageError(f"argument {flag}: {item!r} is not 'cpu' or 'gpuN'")
    return items
