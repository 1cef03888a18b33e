"""esync-cluster beyond this machine: the ``--backend`` flag and the table of backends.

    esync-cluster --backend ssh --hostfile hosts.txt -ld /shared/logs
    esync-cluster --backend slurm --nodes 2 --node-devices gpu0,gpu1 --gpus-per-node 2
    esync-cluster --backend kubernetes --emit k8s/ --devices gpu0,gpu1,cpu --image REG/esync:1

Every backend starts the same roles from the same pure plan (``plan_roles``) and is watched by
the same supervisor; what differs is where the roles run (the placement), how ports are chosen
and how the roles are started. Each backend keeps all three in one module,
``esync/launch/backends/<name>.py``: its flags (``add_arguments``, ``placed_devices``), its
launch (the ``Launch`` subclass ``main`` drives) and its runner (the ``Backend``).
``placed_devices`` turns the backend's flags into the usual ``--workers``/``--devices`` while the
command line is parsed.
"""
from __future__ import annotations

import argparse

from esync.common.errors import UsageError
from esync.launch.backends import kubernetes, local, slurm, ssh
from esync.launch.launches import Launch

# --backend NAME -> its module, and how that module's launch is made from the resolved flags
BACKENDS = {"local": local, "ssh": ssh, "slurm": slurm, "kubernetes": kubernetes}
LAUNCHES = {"local": local.LocalLaunch.create, "ssh": ssh.SshLaunch,
            "slurm": slurm.SlurmLaunch, "kubernetes": kubernetes.KubernetesLaunch}
# flags that belong to a backend other than local (named when given without --backend)
FOREIGN_TO_LOCAL = {"--hostfile", "--emit", "--apply", "--node-devices", "--nodes"}


def add_arguments(parser: argparse.ArgumentParser) -> set[str]:
    """The backend flags; returns their dests (launcher-only: never passed to main.py)."""
    g = parser.add_argument_group("where the job runs (--backend)")
    g.add_argument("--backend", choices=tuple(BACKENDS), default="local",
                   help="local: processes on this machine; ssh: hosts of --hostfile; slurm: one "
                        "Slurm job (submitit); kubernetes: manifests (--emit, --apply)")
    dests = {"backend"}
    for module in (ssh, slurm, kubernetes):       # the local backend has no flags of its own
        dests |= module.add_arguments(parser)
    return dests


def placed_devices(args, argv: list[str]) -> list[str] | None:
    """Check the backend flags; the devices ssh and Slurm place (None: --workers/--devices)."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if args.backend == "local":
        foreign = sorted(given & FOREIGN_TO_LOCAL)
        if foreign:
            raise UsageError(f"{foreign[0]} belongs to another backend: add --backend")
        return None
    module = BACKENDS[args.backend]
    if module.PLACED_BY and given & {"--workers", "--devices"}:
        raise UsageError(f"--backend {args.backend} places workers by {module.PLACED_BY}: "
                         "leave out --workers and --devices")
    return module.placed_devices(args)


def make_launch(args, parser) -> Launch:
    """The job of ``--backend``."""
    return LAUNCHES[args.backend](args, parser)
