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

The parts: ``plan.py`` (which processes, with which command and environment, on which host: pure),
``backends/`` (where they run: ``local.py`` here), ``supervisor.py`` (progress, failures, stalls,
restarts; it sees only backend handles).
"""
import argparse
import json
import os
import secrets
import shutil
import signal
import sys
from pathlib import Path

from esync import cli
from esync.launch import remote
from esync.netns import NetnsError
from esync.launch.backends.local import LocalBackend
from esync.launch.backends.netns import NetnsBackend, add_network_args, layout_from_args
from esync.launch.plan import MAIN, REPO, ClusterConfig, Hosts, device_names, plan_roles
from esync.launch.supervisor import Options, Progress, Supervisor
from esync.procs import free_port, port_is_free

__all__ = ["CLUSTER_DEFAULTS", "MAIN", "REPO", "build_parser", "main", "worker_argv"]

# The main job's defaults differ from main.py's (which keep the original's): a small network that
# trains in minutes on a CPU, learning rates that suit it, and a time budget. Learning rates have
# the original's meaning (x the gradient summed over the batch): 0.05 / 64 is a step of 0.05 on
# the mean gradient of a 64-sample batch.
CLUSTER_LR = 0.05 / 64
# ESync's aggregation: the benchmark's best rule (docs/benchmark/report.md), deltas weighted by
# k_i with DiLoCo's outer Nesterov momentum 0.9 and outer learning rate 0.7. main.py keeps the
# original's plain mean; `--aggregation mean --outer-momentum 0 --no-nesterov -gl 1` here too.
CLUSTER_DEFAULTS = dict(network="lenet", cpu=1, learning_rate=CLUSTER_LR, local_lr=CLUSTER_LR,
                        eval_duration=10, max_seconds=90.0, mode="esync",
                        aggregation="weighted", outer_momentum=0.9, nesterov=True, global_lr=0.7)
STATE_SERVER_RESTARTS = 3        # a state server that keeps dying is a failure, not a blip
DEFAULT_SLOWDOWN = "1,1,4,8"      # the emulated cluster: two fast, one 4x, one 8x slower
LOCAL_ADDRESS = "127.0.0.1"       # the local backend's one host
LAUNCHER_ONLY = {"workers", "slowdown_list", "devices", "servers", "threads", "port", "state_port",
                 "no_evaluator", "no_summary", "quiet", "stall_timeout", "startup_timeout",
                 "restarts", "net", "hosts", "bandwidth", "server_bandwidth"}
# Set per role by the plan (the state server's address, each worker's host) or passed in the
# environment (the token: never on a command line, where `ps` shows it).
PLANNED = {"state_server_ip", "state_server_port", "host_name", "state_token"}


def _device_list(text: str, workers: int) -> list[str]:
    items = [t.strip() for t in text.split(",")] if text else ["cpu"]
    if len(items) == 1:
        items *= workers
    if len(items) != workers:
        raise cli.UsageError(f"argument --devices: {len(items)} devices for {workers} workers")
    for item in items:
        if item != "cpu" and not (item.startswith("gpu") and item[3:].isdigit()):
            raise cli.UsageError(f"argument --devices: {item!r} is not 'cpu' or 'gpuN'")
    return items


def _slowdown_list(text: str, workers: int) -> list[float]:
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        raise cli.UsageError(f"argument --slowdown: {text!r} is not a comma-separated list of "
                             "numbers") from None
    if len(values) == 1:
        values *= workers
    if len(values) != workers:
        raise cli.UsageError(f"argument --slowdown: {len(values)} factors for {workers} workers "
                             "(give one per worker, or one for all)")
    if any(v < 1 for v in values):
        raise cli.UsageError("argument --slowdown: factors must be >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = cli._Parser(prog="esync-cluster", description=__doc__.split("\n\n")[0],
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cli.add_training_args(parser)
    cli.add_run_args(parser, one_worker=False)
    parser.set_defaults(**CLUSTER_DEFAULTS)
    g = parser.add_argument_group("cluster")
    g.add_argument("--workers", type=cli._positive_int, default=4, help="number of workers")
    g.add_argument("--slowdown", dest="slowdown_list", default=None,
                   help="slow-down factor per worker, comma-separated, or one for all "
                        "(default: 1,1,4,8 with 4 workers, else 1)")
    g.add_argument("--devices", default="cpu",
                   help="device per worker: cpu or gpuN, comma-separated (or one for all)")
    g.add_argument("--servers", type=cli._positive_int, default=1, help="parameter servers")
    g.add_argument("--threads", type=cli._positive_int, default=1,
                   help="OMP_NUM_THREADS of each worker (1 keeps emulated speeds repeatable)")
    g.add_argument("--port", type=cli._port, default=None,
                   help="scheduler port (default: a free one)")
    g.add_argument("--state-port", type=cli._port, default=None,
                   help="state server port (default: a free one)")
    g.add_argument("--no-evaluator", action="store_true", help="do not score checkpoints")
    g.add_argument("--no-summary", action="store_true", help="do not write the summary JSON")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    add_network_args(parser.add_argument_group("network"))
    LAUNCHER_ONLY.update(remote.add_arguments(parser))
    r = parser.add_argument_group("failures")
    r.add_argument("--stall-timeout", type=cli.bounded_number(float, low=0, strict=True,
                                                              must="a positive number of seconds"),
                   default=None,
                   help="stop (or restart) the job when no worker finishes a round for this "
                        "long (default: the larger of 60 s and 20 x the median round time)")
    r.add_argument("--startup-timeout", type=cli.bounded_number(
                       float, low=0, strict=True, must="a positive number of seconds"),
                   default=180.0,
                   help="the first round may take this long (imports, data, rendezvous)")
    r.add_argument("--restarts", type=cli._non_negative_int, default=0,
                   help="when a process dies or the job stalls, restart the whole cluster from "
                        "the last checkpoint (--resume), up to this many times")
    return parser


def worker_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """Re-create main.py flags from the resolved namespace (launcher-only options left out)."""
    argv = []
    for action in parser._actions:
        if not action.option_strings or action.dest in LAUNCHER_ONLY | PLANNED | {"help"}:
            continue
        value = getattr(args, action.dest)
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            argv += [flag] if value else []
        elif isinstance(action, argparse.BooleanOptionalAction):
            argv += [action.option_strings[0] if value else action.option_strings[1]]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


class LocalCluster:
    """The launcher's side of a run on this machine: the plan's inputs, restarts, reports."""

    def __init__(self, args, parser, backend=None, hosts=None):
        self.args, self.parser = args, parser
        self._backend = backend or LocalBackend()
        self.mode_dir = _mode_dir(args)
        self.proc_dir = self.mode_dir / "processes"
        self.devices = _device_list(args.devices, args.workers)
        self.hosts = hosts or Hosts.single(args.host_name, LOCAL_ADDRESS, args.workers)
        self.uses_state_server = args.mode == "esync" and not args.local_iters
        self.token = args.state_token or secrets.token_urlsafe(24)
        self.config = self.configure(resume=args.resume, overwrite=args.overwrite)

    def configure(self, *, resume: bool, overwrite: bool) -> ClusterConfig:
        """The plan's input; ports are picked again for each start unless the user fixed them."""
        a, address = self.args, self.hosts.ps.address

        def on_ps(fn, *args):        # ports as the ps host sees them (its own namespace, if any)
            return self._backend.run_on(self.hosts.ps.name, fn, *args)
        port = a.port or on_ps(free_port, address)
        if not on_ps(port_is_free, port, address):
            raise cli.UsageError(f"argument --port: port {port} is in use; pick another or "
                                 "leave --port out to get a free one")
        state_port = None
        if self.uses_state_server:
            state_port = a.state_port or on_ps(free_port, address)
            if not on_ps(port_is_free, state_port, address):
                raise cli.UsageError(f"argument --state-port: port {state_port} is in use")
        a.resume, a.overwrite = resume, overwrite
        return ClusterConfig(
            mode=a.mode, devices=tuple(self.devices), slowdowns=tuple(a.slowdowns), port=port,
            train_argv=tuple(worker_argv(self.parser, a)), servers=a.servers, threads=a.threads,
            evaluator=not a.no_evaluator, state_port=state_port, state_token=self.token,
            state_db=str(self.mode_dir / "state_server.sqlite3"))

    def plan(self):
        runner = getattr(self, "_backend", None)     # remote jobs: the address is theirs
        if self.uses_state_server and runner is not None:
            address, port = runner.reachable(self.hosts.ps.name, self.hosts.ps.address,
                                             self.config.state_port)
            print(f"esync-cluster: dashboard at http://{address}:{port}/dashboard/"
                  f"?job={self.args.job}", flush=True)
        return plan_roles(self.config, self.hosts)

    def backend(self):
        return self._backend

    def restart_plan(self, attempt: int):
        """Make the folder ready to resume from the last checkpoint; the plan that does it.

        The checkpoint resumed from is the newest one of a round that every device has logged:
        rank 0 writes a round's checkpoint before a slower worker writes that round's log, so
        the newest checkpoint may be a round that a killed worker never logged. Everything after
        the chosen round (device logs, checkpoints, their scores) is deleted and run again, so
        every round is logged once. With no such checkpoint the job starts over.
        """
        from esync.checkpoint import CheckpointError, CheckpointStore
        store = CheckpointStore(self.mode_dir / "checkpoints")
        logged = rounds_logged_by_all(self.mode_dir, device_names(self.config.devices))
        try:
            found = store.latest(network=self.args.network, at_most=logged)
        except CheckpointError as exc:
            raise RuntimeError(str(exc)) from None
        if found is None:
            print("esync-cluster: no checkpoint of a round every device logged; starting the "
                  "job over", file=sys.stderr)
            return self._replan(resume=False, overwrite=True)
        done = int(found[1]["round"])
        forget_rounds_after(self.mode_dir, store, done)
        store.clear_done()
        print(f"esync-cluster: resuming from {found[0].name} (round {done})", file=sys.stderr)
        return self._replan(resume=True, overwrite=False)

    def _replan(self, *, resume: bool, overwrite: bool):
        try:
            self.config = self.configure(resume=resume, overwrite=overwrite)
        except cli.UsageError as exc:           # e.g. a fixed --port taken meanwhile
            raise RuntimeError(str(exc)) from None
        return self.plan()

    def state_view(self) -> str:
        """The state server's view of every worker (for a stall report), or why there is none."""
        from esync.state_client import StateClient, StateServerError
        url = f"http://{self.hosts.ps.address}:{self.config.state_port}"

        def ask():
            with StateClient(url, job=self.args.job, token=self.token, timeout=3.0,
                             retry_for=0.0) as client:
                return client.state()
        try:
            runner = getattr(self, "_backend", None)     # remote jobs ask from here
            view = runner.run_on(self.hosts.ps.name, ask) if runner else ask()
        except (StateServerError, OSError) as exc:
            return f"  (no answer from {url}: {exc})"
        return _format_view(view)


def _device_logs(mode_dir: Path):
    """(device, round, path) of every round log (``<host>/<device>/iter-N.txt``)."""
    for log in mode_dir.glob("*/*/iter-*.txt"):
        if log.parent.parent.name in ("processes", "checkpoints"):
            continue
        try:
            yield log.parent.name, int(log.stem.split("-")[1]), log
        except ValueError:
            continue


def rounds_logged_by_all(mode_dir: Path, devices) -> int:
    """The last round R such that every device has logged rounds 1..R (0: none)."""
    rounds: dict[str, set[int]] = {}
    for device, round_no, _ in _device_logs(mode_dir):
        rounds.setdefault(device, set()).add(round_no)
    complete = []
    for device in devices:
        have, r = rounds.get(device, set()), 0
        while r + 1 in have:
            r += 1
        complete.append(r)
    return min(complete, default=0)


def forget_rounds_after(mode_dir: Path, store, done: int) -> None:
    """Delete what rounds after ``done`` left (device logs, checkpoints, scores): they run again."""
    from esync.fsutil import atomic_write_text
    for _, round_no, log in _device_logs(mode_dir):
        if round_no > done:
            log.unlink()
    for path in store.list():
        if store.round_of(path) > done:
            path.unlink()
    scores = mode_dir / "evaluations.jsonl"
    if scores.exists():
        kept = []
        for line in scores.read_text().splitlines():
            try:
                if int(json.loads(line)["round"]) > done:
                    continue
            except (ValueError, KeyError, TypeError):
                pass
            kept.append(line)
        atomic_write_text(scores, "".join(f"{line}\n" for line in kept))


def _format_view(view) -> str:
    lines = []
    for key, value in (view.items() if isinstance(view, dict) else [("state", view)]):
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"  {key}:")
            lines += [f"    {json.dumps(v, sort_keys=True)}" for v in value]
        elif isinstance(value, dict) and value and all(isinstance(v, dict)
                                                       for v in value.values()):
            lines.append(f"  {key}:")
            lines += [f"    {k}: {json.dumps(v, sort_keys=True)}" for k, v in value.items()]
        else:
            lines.append(f"  {key}: {json.dumps(value)}")
    return "\n".join(lines)


def _mode_dir(args) -> Path:
    from esync.modes import mode_dir
    return mode_dir(args)


def _check_before_start(args) -> None:
    from esync.data import FASHION_FILES, FASHION_SUBDIR
    folder = Path(args.data_dir) / FASHION_SUBDIR
    missing = [f for pair in FASHION_FILES.values() for f in pair if not (folder / f).exists()]
    if missing:
        raise cli.UsageError(f"data folder {folder} lacks {', '.join(missing)}: run "
                             f"`python scripts/prepare_data.py --data-dir {args.data_dir}`")
    env_workers = os.environ.get("DMLC_NUM_WORKER")
    if env_workers and env_workers != str(args.workers):
        raise cli.UsageError(f"DMLC_NUM_WORKER={env_workers} in the environment does not match "
                             f"--workers {args.workers}; unset it or make them agree")
    if args.backend == "local" and any(d != "cpu" for d in _device_list(args.devices,
                                                                          args.workers)):
        import mxnet as mx
        gpus = mx.context.num_gpus()
        for d in _device_list(args.devices, args.workers):
            if d != "cpu" and int(d[3:]) >= gpus:
                raise cli.UsageError(f"argument --devices: {d} asked for, but this machine has "
                                     f"{gpus} GPU(s); use cpu")
    folder = _mode_dir(args)
    earlier = list(folder.glob("*/*/iter-*.txt"))
    if earlier and not (args.overwrite or args.resume):
        raise cli.UsageError(f"{folder} already holds logs of an earlier run; choose another "
                             "--log-dir, or pass --overwrite (replace) or --resume (continue)")
    if args.resume:
        from esync.checkpoint import CheckpointError, CheckpointStore
        try:
            found = CheckpointStore(folder / "checkpoints").latest(network=args.network)
        except CheckpointError as exc:
            raise cli.UsageError(f"--resume: {exc}") from None
        if found is None:
            raise cli.UsageError(f"--resume: no checkpoint in {folder / 'checkpoints'}")
        # The evaluator starts before rank 0: it must not see the last run's end marker.
        CheckpointStore(folder / "checkpoints").clear_done()
    if args.overwrite:
        for sub in ("checkpoints", "processes"):
            shutil.rmtree(folder / sub, ignore_errors=True)
        for name in ("evaluations.jsonl", "state_server.sqlite3"):
            (folder / name).unlink(missing_ok=True)


def _write_summary(mode_dir: Path) -> None:
    from esync.analysis.summary import LogError, write_summary
    try:
        path = write_summary(mode_dir)
        print(f"esync-cluster: summary written to {path}")
    except LogError as exc:
        print(f"esync-cluster: no summary: {exc}", file=sys.stderr)


def _report(mode_dir: Path) -> None:
    from esync.evaluator import EvaluationLog
    log = EvaluationLog(mode_dir / "evaluations.jsonl")
    acc = log.poll()
    print(f"esync-cluster: done; logs in {mode_dir}"
          + (f"; final test accuracy {acc:.4f}" if acc is not None else ""))


def _backend(args):
    """Where the processes run, and the placement of hosts the plan gets from it.

    --net netns builds the emulated hosts now (clearing what dead launchers left first); the
    supervisor's close() of the backend removes them on every way out.
    """
    layout = layout_from_args(args, args.workers)
    if layout is None:
        return LocalBackend(), None
    backend = NetnsBackend(layout)
    backend.create()
    return backend, backend.placement()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _parse(parser, argv) -> argparse.Namespace:
    """Parse and check every flag; a bad one raises UsageError before anything is started."""
    args = parser.parse_args(argv)
    # Every process gets absolute paths: workers run from the repository, the state server
    # from state_server/, the user from anywhere.
    args.log_dir = str(Path(args.log_dir).resolve())
    args.data_dir = str(Path(args.data_dir).resolve())
    args.tensorboard = str(Path(args.tensorboard or _mode_dir(args)).resolve())
    remote.prepare(args, sys.argv[1:] if argv is None else list(map(str, argv)))
    if args.backend != "local" and args.net != "loopback":
        raise cli.UsageError(f"--net {args.net} emulates hosts on this machine: it needs "
                             f"--backend local, not --backend {args.backend}")
    if args.slowdown_list is None:
        args.slowdown_list = DEFAULT_SLOWDOWN if args.workers == 4 else "1"
    args.slowdowns = _slowdown_list(args.slowdown_list, args.workers)
    if args.use_dcasgd and args.mode != "async":
        raise cli.UsageError("argument -dcasgd/--use-dcasgd: needs -m async")
    if args.mode == "local":
        raise cli.UsageError("-m local is one device: run `python main.py -m local ...`")
    if args.resume and args.overwrite:
        raise cli.UsageError("--resume and --overwrite exclude each other")
    cli.check_esync_options(args)
    layout_from_args(args, args.workers)
    if args.backend != "kubernetes":          # the pods check their own data and logs
        _check_before_start(args)
    return args


def main(argv=None) -> int:
    parser = build_parser()
    backend = None
    # Until the supervisor takes the signals over, SIGTERM unwinds like Ctrl-C, so that the
    # backend's resources (emulated hosts) are freed on that path too.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        args = _parse(parser, argv)
        if args.backend == "local":
            backend, hosts = _backend(args)
            cluster = LocalCluster(args, parser, backend, hosts)
        else:
            cluster = remote.make_cluster(args, parser, LocalCluster)
            backend = cluster.backend()
        specs = cluster.plan()
        if args.backend == "kubernetes":
            written = cluster.emit()
            print(f"esync-cluster: wrote {len(written)} manifests and a Dockerfile to "
                  f"{args.emit} (Kubernetes {remote.kubernetes_version()})")
            if cluster.emit_only:
                return 0
        else:
            _write_cluster_json(cluster.mode_dir, args)
        options = Options(stall_timeout=args.stall_timeout,
                          startup_timeout=args.startup_timeout, restarts=args.restarts,
                          state_restarts=STATE_SERVER_RESTARTS)
        if args.backend == "kubernetes":
            # The logs are on the cluster's volume: rounds cannot be watched from here.
            options.stall_timeout = options.startup_timeout = float("inf")
        progress = Progress(cluster.mode_dir, args.max_rounds, f"{args.mode} {args.network}",
                            quiet=args.quiet)
        supervisor = Supervisor(backend, cluster.proc_dir, cluster.mode_dir, options,
                                progress=progress, on_restart=cluster.restart_plan,
                                state_view=cluster.state_view if cluster.uses_state_server
                                else None)
        code = supervisor.run(specs)
    except cli.UsageError as exc:
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
    if code == 0 and args.backend == "kubernetes":
        print(f"esync-cluster: done; the logs are on the volume {args.k8s_name}-logs")
    elif code == 0:
        if not args.no_summary:
            _write_summary(cluster.mode_dir)
        _report(cluster.mode_dir)
    return code


def _write_cluster_json(mode_dir: Path, args) -> None:
    mode_dir.mkdir(parents=True, exist_ok=True)
    spec = {k: v for k, v in vars(args).items()
            if isinstance(v, (str, int, float, bool, list, type(None))) and k != "state_token"}
    (mode_dir / "cluster.json").write_text(json.dumps(spec, indent=1))


if __name__ == "__main__":
    sys.exit(main())
