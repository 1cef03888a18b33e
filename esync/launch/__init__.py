"""One command for a whole heterogeneous cluster on this machine.

    esync-cluster                                   # ESync, 4 CPU workers slowed 1x,1x,4x,8x, lenet
    esync-cluster -m sync --max-seconds 60          # the same cluster under SSGD
    esync-cluster --workers 2 --slowdown 1,4 --devices cpu,gpu0 -n resnet18-v1
    esync-cluster --restarts 2                      # heal: restart from the last checkpoint

Starts the ESync state server (for ``-m esync``), the ps-lite scheduler and server(s), the
evaluator and one worker per device, each with the ``DMLC_*`` environment of its role. It shows
progress, stops everything on Ctrl-C or SIGTERM, and when any process dies it stops the rest,
names the process, shows the tail of its log and exits non-zero; when no worker finishes a round
for ``--stall-timeout`` seconds it names the stuck processes, prints the state server's view and
does the same. Every child dies with the launcher, even when the launcher is SIGKILLed. Logs land
in the analysis layout (``LOG_DIR/NETWORK/MODE/HOST/DEVICE``), process output in
``.../MODE/processes/``, and a summary JSON is written at the end. Every training flag of
``main.py`` is accepted.

Healing (``--restarts N``): ps-lite cannot admit a new worker into a running job (the scheduler
fixes the node set at the rendezvous, and the survivors of a death wait in its barriers), so a
death is healed by restarting the whole cluster with ``--resume`` from the last checkpoint, up to
N times. Rounds after that checkpoint are run again and their logs rewritten, so every round is
logged once and at most one checkpoint interval (``-e`` rounds) of work is lost.

The parts (the cluster's world: nothing here imports MXNet):

- ``flags.py``: the command line, resolved once; ``program.py``: ``main``, backend-blind;
- ``launches.py``: the interface of a job and the restarts; ``remote.py``: ``--backend`` and the
  table of backends;
- ``roles.py``: which processes, with which command and environment, on which host (pure);
- ``resources.py``: what each process gets: emulated or real devices, threads, its GPU (pure);
  ``gpus.py``: MXNet's wheels and the GPUs each runs on;
- ``backends/``: one module per backend (its flags, its launch, its runner);
- ``supervisor.py``: progress, failures, stalls, restarts (it sees only backend handles);
- the emulated hosts (``--net netns``) and CPU caps are the emulation world's
  (``esync.emulation``), which ``backends/netns.py`` and ``backends/local.py`` drive.
"""
from esync.launch.program import main
from esync.common.presets import CLUSTER_LR
from esync.launch.flags import build_parser, worker_argv
from esync.launch.roles import MAIN, REPO

__all__ = ["CLUSTER_LR", "MAIN", "REPO", "build_parser", "main", "worker_argv"]
