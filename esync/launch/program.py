"""esync-cluster's program: parse, make the job, supervise it, report. Backend-blind."""
import signal
import sys

from esync.common.errors import UsageError
from esync.launch.remote import make_launch
from esync.launch.namespaces import NetnsError
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
    return code


if __name__ == "__main__":
    sys.exit(main())
