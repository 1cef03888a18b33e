"""``main.py``: one entry point for every role, chosen by ``DMLC_ROLE``.

    python main.py -m local -c 1 -n lenet -l 0.05 -e 100            # standalone, no cluster
    DMLC_ROLE=scheduler DMLC_PS_ROOT_URI=10.1.1.34 DMLC_PS_ROOT_PORT=9091 \\
        DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=6 python main.py            # likewise server
    DMLC_ROLE=worker ...same DMLC_* variables... python main.py -m esync -g 0 -n resnet18-v1
    DMLC_ROLE=evaluator python main.py -m esync -n resnet18-v1        # scores checkpoints

The flags are ``esync.cli``'s; this module starts the role, which for a worker or an evaluator
means the worker world (``esync.worker.trainer``, ``esync.worker.evaluator``).
"""
import os
import sys

from esync.cli import build_parser, dmlc_environment, parse_args
from esync.common.errors import UsageError, guarded


def main(argv=None) -> int:
    role = os.environ.get("DMLC_ROLE", "")
    try:
        if "--explain" in (sys.argv[1:] if argv is None else argv):
            return _explain(parse_args(argv), role)
        if role:
            dmlc_environment(role)
        if role in ("scheduler", "server", "worker"):
            from esync.common.netif import choose_dmlc_interface
            choose_dmlc_interface()     # the interface that routes to the scheduler, if unset
        if role == "evaluator":
            # MXNet starts a ps-lite server at import for any DMLC_ROLE other than worker; the
            # evaluator is no ps-lite node, so the variable must be gone before MXNet loads.
            os.environ.pop("DMLC_ROLE")
        if role in ("scheduler", "server"):
            # Importing MXNet with these roles runs ps-lite's loop and exits when the job ends.
            import mxnet  # noqa: F401
            return 0
        args = parse_args(argv)
        if role == "evaluator":
            return _run_evaluator(args)
        if args.collective == "allreduce":
            from esync.common.collectives import check_environment
            from esync.common.netif import choose_gloo_interface
            check_environment()
            choose_gloo_interface()     # the interface that routes to the rendezvous, if unset
        elif not role and args.mode != "local":
            raise UsageError(f"-m {args.mode} needs the parameter server: start the roles with "
                             "DMLC_ROLE=scheduler|server|worker (see README), or run the whole "
                             "cluster with `esync-cluster`; use -m local for one device")
        if role == "worker" and args.mode == "local":
            raise UsageError("-m local runs without a cluster: unset DMLC_ROLE")
        from esync.worker import trainer
        return trainer.run(args)
    except UsageError as exc:
        print(f"main.py: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("main.py: interrupted", file=sys.stderr)
        return 130


def _explain(args, role: str) -> int:
    """Print the resolved run; start, import and contact nothing."""
    from esync.common import presets
    print(presets.explain(args.resolution, build_parser(), values=vars(args),
                          extra=[("role", f"DMLC_ROLE={role}" if role else
                                  "none (standalone: -m local)")]))
    return 0


def _run_evaluator(args) -> int:
    from esync.common import runlayout
    from esync.worker import evaluator
    return guarded(lambda: evaluator.run(args, runlayout.mode_dir(args)))
