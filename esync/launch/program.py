"""esync-cluster's program: parse, make the job, supervise it, report. Backend-blind."""
import json
import os
import signal
import sys
from pathlib import Path

from esync.common import runlayout
from esync.common.errors import UsageError
from esync.common.files import atomic_write_text
from esync.common.presets import explain
from esync.emulation.namespaces import NetnsError
from esync.launch.remote import make_launch
from esync.launch.flags import build_parser, parse
from esync.launch.supervisor import Options, RoundProgress, Supervisor

STATE_SERVER_RESTARTS = 3        # a state server that keeps dying is a failure, not a blip


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = build_parser()
    backend = None
    # Until the supervisor takes the signals over, SIGTERM unwinds like Ctrl-C, so that the
    # backend's resources (emulated hosts) are freed on that path too.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        args = parse(parser, argv)
        if args.explain:
            print(explain(args.resolution, parser, values=vars(args),
                          extra=[("each worker gets", planned_resources(args))]))
            return 0
        job = make_launch(args, parser)
        backend = job.backend()
        specs = job.plan()
        if not job.prepare():
            return 0
        options = job.supervision(Options(
            stall_timeout=args.stall_timeout, startup_timeout=args.startup_timeout,
            restarts=args.restarts, state_restarts=STATE_SERVER_RESTARTS))
        progress = RoundProgress(job.mode_dir, args.max_rounds, f"{args.mode} {args.network}",
                            quiet=args.quiet)
        supervisor = Supervisor(backend, job.proc_dir, job.mode_dir, options,
                                progress=progress, on_restart=job.restart_plan,
                                state_view=job.state_view if job.uses_state_server else None)
        code = supervisor.run(specs)
    except UsageError as exc:
        print(f"esync-cluster: error: {exc}", file=sys.stderr)
        return 2
    except (NetnsError, RuntimeError, OSError) as exc:
        print(f"esync-cluster: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("esync-cluster: interrupted", file=sys.stderr)
        return 130
    finally:
        if backend is not None:
            backend.close()                  # idempotent; the supervisor closed it already
    job.finish(code)
    record_resolution(job.mode_dir, args.resolution)
    return code


def planned_resources(args) -> str:
    """What each worker gets of its machine, by the rules of esync.launch.resources, in words
    (remote hosts: decided at start, from each host's cores)."""
    from esync.launch import resources
    from esync.launch.flags import device_list
    from esync.launch.launches import emulates
    devices = device_list(args.devices, args.workers)
    gpus = [f"{d}: CUDA_VISIBLE_DEVICES={resources.visible_devices(d)}"
            for d in devices if resources.gpu_index(d) is not None]
    emulated = emulates(args)
    if args.backend != "local":
        threads = (f"{args.threads} each" if args.threads else
                   "decided at start from each host's cores (GPU workers 2, the rest shared)")
    else:
        cores = len(os.sched_getaffinity(0))
        threads = ",".join(map(str, resources.worker_threads(
            devices, ["here"] * len(devices), {"here": cores}, given=args.threads,
            emulated=emulated, coordination_machine="here")))
    kind = ("emulated (CPU caps, pinning, one compute thread each)" if emulated
            else "real (nothing capped)")
    return "; ".join([f"devices {kind}", f"threads per worker {threads}", *gpus])


def record_resolution(mode_dir: Path, resolution) -> None:
    """run.json keeps the launcher's resolution (every value's source, the presets applied)
    beside rank 0's own record of its flags, which it wrote at the start."""
    path = runlayout.run_file(mode_dir)
    try:
        content = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        content = {}
    if not isinstance(content, dict) or not mode_dir.is_dir():
        return
    content["resolved"] = resolution.record()
    atomic_write_text(path, json.dumps(content, indent=1))


if __name__ == "__main__":
    sys.exit(main())
