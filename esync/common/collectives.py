"""The collectives (``--collective``): ``ps``, MXNet's parameter server, or ``allreduce``,
Horovod's ring over Gloo (``esync.worker.allreduce``), and what the allreduce needs, checked
without MXNet: Horovod installed here, and the variables of whoever starts the worker.

The command line, the launcher and the benchmark read these; only the worker imports Horovod.
"""
from __future__ import annotations

import os

from esync.common.errors import UsageError

COLLECTIVES = ("ps", "allreduce")

# What Horovod's Gloo controller needs from whoever starts the worker (horovodrun sets them all).
REQUIRED_ENV = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                "HOROVOD_GLOO_RENDEZVOUS_PORT")
INSTALL_HINT = ("install it with `bash scripts/setup.sh` (it builds horovod==0.28.1 with MXNet "
                "and Gloo; needs cmake and g++: `apt-get install cmake g++`)")


def horovod_missing() -> str | None:
    """Why ``--collective allreduce`` cannot run here (one phrase), or None; no MXNet import."""
    import importlib.util
    if importlib.util.find_spec("horovod") is None:
        return f"Horovod is not installed; {INSTALL_HINT}"
    return None


def check_environment(env=os.environ) -> None:
    """A worker started by hand without Horovod's variables gets told how to start it."""
    missing = [name for name in REQUIRED_ENV if not env.get(name)]
    if missing:
        raise UsageError(f"--collective allreduce: {', '.join(missing)} not set; start the "
                         "workers with `horovodrun --gloo -np N -H host:slots python main.py "
                         "... --collective allreduce`, or run the whole cluster with "
                         "`esync-cluster --collective allreduce` (see README)")
