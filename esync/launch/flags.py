"""esync-cluster's command line: every flag of main.py plus the cluster's, checked at once.

``parse`` returns the resolved namespace, final before anything starts: paths made absolute, the
backend's placement turned into ``--workers``/``--devices``, one slow-down factor per worker.
Nothing downstream changes it; each job derives what it needs from it.
"""
import argparse
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from esync import cli
from esync.common import presets, runlayout
from esync.common.argtypes import (UsageParser, bounded_number, non_negative_int, port,
                                   positive_int, slowdown_factors)
from esync.common.presets import PresetHelpFormatter
from esync.common.errors import UsageError
import esync.launch.remote as remote
from esync.launch import exchange_cost
from esync.emulation.hosts import add_network_args, layout_from_args

STATE_SERVER_RESTARTS = 3        # a state server that keeps dying is a failure, not a blip
LOCAL_ADDRESS = "127.0.0.1"       # the local backend's one host
LAUNCHER_ONLY = {"emulation", "cpu_share", "no_cpu_pinning", "speed_schedule",
                 "workers", "slowdown_list", "devices", "servers", "threads", "port", "state_port",
                 "no_evaluator", "no_summary", "quiet", "stall_timeout", "startup_timeout",
                 "restarts", "net", "hosts", "bandwidth", "server_bandwidth", "explain"}
# Set per role by the plan (the state server's address, each worker's host) or passed in the
# environment (the token: never on a command line, where `ps` shows it).
PLANNED = {"state_server_ip", "state_server_port", "host_name", "state_token", "local_iters"}


def device_list(text: str, workers: int) -> list[str]:
    items = [t.strip() for t in text.split(",")] if text else ["cpu"]
    if len(items) == 1:
        items *= workers
    if len(items) != workers:
        raise UsageError(f"argument --devices: {len(items)} devices for {workers} workers")
    for item in items:
        if item != "cpu" and not (item.startswith("gpu") and item[3:].isdigit()):
            raise UsageError(f"argument --devices: {item!r} is not 'cpu' or 'gpuN'")
    return items


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="esync-cluster", description=__doc__.split("\n\n")[0],
                         formatter_class=PresetHelpFormatter)
    cli.add_training_args(parser)
    cli.add_run_args(parser, one_worker=False)
    g = parser.add_argument_group("cluster")
    g.add_argument("--workers", type=positive_int, default=4, help="number of workers")
    g.add_argument("--slowdown", dest="slowdown_list", default="1",
                   help="slow-down factor per worker, comma-separated, or one for all")
    g.add_argument("--devices", default="cpu",
                   help="device per worker: cpu or gpuN, comma-separated (or one for all)")
    g.add_argument("--servers", type=positive_int, default=1, help="parameter servers")
    g.add_argument("--threads", type=positive_int, default=None,
                   help="OMP_NUM_THREADS of each worker (default: 1 when devices are emulated, "
                        "else the cores left to it: esync.launch.resources)")
    g.add_argument("--port", type=port, default=None,
                   help="scheduler port (default: a free one)")
    g.add_argument("--state-port", type=port, default=None,
                   help="state server port (default: a free one)")
    g.add_argument("--no-evaluator", action="store_true", help="do not score checkpoints")
    g.add_argument("--no-summary", action="store_true", help="do not write the summary JSON")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--explain", action="store_true",
                   help="print every resolved option with its source (default, preset, user "
                        "flag) and exit without starting or contacting anything")
    e = parser.add_argument_group("emulated devices")
    e.add_argument("--emulation", choices=["auto", "cpu-cap", "sleep"], default="auto",
                   help="how --slowdown makes a CPU worker slower: cpu-cap runs each worker in "
                        "a cgroup with a CPU quota (share/F of a core; needs root), sleep waits "
                        "(F-1)x each iteration's compute; auto: cpu-cap where possible, else "
                        "sleep with a warning")
    e.add_argument("--cpu-share", type=bounded_number(float, low=0.001, high=64.0,
                                                      must="a number of cores in [0.001, 64]"),
                   default=None,
                   help="cores given to a x1 device under cpu-cap (a xF device gets share/F); "
                        "default: the most that lets every device's cap plus a reserve of 0.8 "
                        "of a core for the parameter server, scheduler, evaluator and state "
                        "server fit this machine's cores")
    e.add_argument("--no-cpu-pinning", action="store_true",
                   help="under cpu-cap, let the scheduler move each device's compute between "
                        "cores (default: each capped device computes on one core, the caps "
                        "spread evenly over the cores: moving cost the x1 devices about 5%% of "
                        "their speed)")
    e.add_argument("--speed-schedule", default=None, metavar="SPEC",
                   help="devices whose speed changes during training: DEVICE:FACTOR@SECONDS,..."
                        "[;DEVICE:...], e.g. 'cpu1:1@0,6@30' (cpu1 becomes 6x slower at 30 s "
                        "of training); applied by changing the CPU cap live, or the factor "
                        "under sleep emulation")
    add_network_args(parser.add_argument_group("network"))
    LAUNCHER_ONLY.update(remote.add_arguments(parser))
    r = parser.add_argument_group("failures")
    r.add_argument("--stall-timeout", type=bounded_number(float, low=0, strict=True,
                                                              must="a positive number of seconds"),
                   default=None,
                   help="stop (or restart) the job when no worker finishes a round for this "
                        "long (default: the larger of 60 s and 20 x the median round time)")
    r.add_argument("--startup-timeout", type=bounded_number(
                       float, low=0, strict=True, must="a positive number of seconds"),
                   default=180.0,
                   help="the first round may take this long (imports, data, rendezvous)")
    r.add_argument("--restarts", type=non_negative_int, default=0,
                   help="when a process dies or the job stalls, restart the whole cluster from "
                        "the last checkpoint (--resume), up to this many times")
    return parser


def worker_argv(parser: argparse.ArgumentParser, args: argparse.Namespace,
                **override) -> list[str]:
    """Re-create main.py flags from the resolved namespace (launcher-only options left out);
    ``override`` replaces values without touching ``args`` (``resume=True`` on a restart)."""
    argv = []
    for action in parser._actions:
        if not action.option_strings or action.dest in LAUNCHER_ONLY | PLANNED | {"help"}:
            continue
        value = override.get(action.dest, getattr(args, action.dest))
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            argv += [flag] if value else []
        elif isinstance(action, argparse.BooleanOptionalAction):
            argv += [action.option_strings[0] if value else action.option_strings[1]]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def parse(parser, argv) -> argparse.Namespace:
    """Parse and check every flag; a bad one raises UsageError before anything is started.
    The values that depend on the situation come from the presets (esync.common.presets),
    resolved once; ``args.resolution`` records where each value came from."""
    argv = sys.argv[1:] if argv is None else list(map(str, argv))
    args = parser.parse_args(argv)
    given = presets.given_options(parser, argv)
    placed = remote.placed_devices(args, argv)
    derived = {}
    if placed is not None:               # ssh and Slurm place the workers themselves
        args.workers, args.devices = len(placed), ",".join(placed)
        derived = {"workers": (args.workers, f"placed by --backend {args.backend}"),
                   "devices": (args.devices, f"placed by --backend {args.backend}")}
    if args.backend != "local" and args.net != "loopback":
        raise UsageError(f"--net {args.net} emulates hosts on this machine: it needs "
                             f"--backend local, not --backend {args.backend}")
    devices = device_list(args.devices, args.workers)
    situation = presets.Situation(
        tool="esync-cluster", backend=args.backend,
        shaped=args.net == "netns" and bool(args.bandwidth or args.server_bandwidth),
        split=args.split_by_class, mode=args.mode, workers=args.workers,
        gpus=any(d != "cpu" for d in devices), user=given)
    defaults = {k: v for k, v in vars(args).items() if k not in given}
    args.resolution = presets.resolve(defaults, situation, excluded=cli.preset_excluded,
                                      derived=derived)
    if _reads_exchange(args.resolution, given):
        # The exchange rule follows what an exchange costs: measured for the values resolved
        # so far (the network, the devices, the links: no preset that reads the cost sets
        # them), then resolved once more with it.
        layout_from_args(args, args.workers)             # a bad --bandwidth fails first
        cost = exchange_cost.estimate({**vars(args), **args.resolution.values},
                                      device_list(args.resolution.values["devices"],
                                                  args.workers))
        situation = replace(situation, exchange_ratio=cost.ratio, exchange_basis=cost.basis)
        args.resolution = presets.resolve(defaults, situation, excluded=cli.preset_excluded,
                                          derived=derived)
    for dest, value in args.resolution.values.items():
        setattr(args, dest, value)
    # Every process gets absolute paths: workers run from the repository, the state server
    # from state_server/, the user from anywhere.
    args.log_dir = str(Path(args.log_dir).resolve())
    args.data_dir = str(Path(args.data_dir).resolve())
    args.tensorboard = str(Path(args.tensorboard or runlayout.mode_dir(args)).resolve())
    args.slowdowns = slowdown_factors(args.slowdown_list, args.workers)
    args.local_iters = _per_worker_local_iters(args.local_iters, args.workers)
    if args.use_dcasgd and args.mode != "async":
        raise UsageError("argument -dcasgd/--use-dcasgd: needs -m async")
    if args.mode == "local":
        raise UsageError("-m local is one device: run `python main.py -m local ...`")
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    cli.check_esync_options(args)
    cli.check_collective(args)
    if args.collective == "allreduce":
        if args.backend == "kubernetes":
            raise UsageError("--collective allreduce runs on the local, ssh and slurm backends; "
                             "the Kubernetes manifests start a parameter server: use "
                             "--collective ps there")
        if args.servers != 1:
            raise UsageError("argument --servers: the allreduce has no parameter server; "
                             "leave --servers out with --collective allreduce")
    layout_from_args(args, args.workers)
    if args.backend != "local" and args.emulation == "cpu-cap":
        raise UsageError(f"--emulation cpu-cap caps processes on this machine: it needs "
                         f"--backend local, not --backend {args.backend}")
    if args.speed_schedule is not None:
        from esync.emulation.schedules import ScheduleError, parse_speed_schedule
        from esync.launch.roles import device_names
        try:
            parse_speed_schedule(args.speed_schedule,
                                 devices=device_names(device_list(args.devices, args.workers)))
        except ScheduleError as exc:
            raise UsageError(f"argument --speed-schedule: {exc}") from None
    if args.backend != "local" and args.network == "lenet" and "network" in given:
        print("esync-cluster: note: -n lenet is the CPU demo's small network; on remote hosts "
              "give the model you mean to train (e.g. -n resnet18-v1)", file=sys.stderr)
    if args.backend != "kubernetes" and not args.explain:   # the pods check their own data
        check_before_start(args)
    return args


def _reads_exchange(resolution, given) -> bool:
    """Whether a preset that reads the exchange's cost applied and sets something the user did
    not give (else the cost would change nothing, and nothing is measured)."""
    return any(p.reads_exchange and p.name in resolution.presets and set(p.sets) - set(given)
               for p in presets.PRESETS)


def _per_worker_local_iters(values: tuple[int, ...], workers: int) -> tuple[int, ...]:
    """One k per worker, or () when the state server decides."""
    if len(values) == 1:
        values = values * workers
    if values and len(values) != workers:
        raise UsageError(f"argument --local-iters: {len(values)} values for {workers} workers; "
                         "give one for all or one per worker")
    if not any(values):
        return ()
    if not all(values):
        raise UsageError("argument --local-iters: fix every worker's k (all above 0) or none "
                         "(0: the state server decides)")
    return values


def check_before_start(args) -> None:
    from esync.common.catalog import FASHION_FILES, FASHION_SUBDIR
    folder = Path(args.data_dir) / FASHION_SUBDIR
    missing = [f for pair in FASHION_FILES.values() for f in pair if not (folder / f).exists()]
    if missing:
        raise UsageError(f"data folder {folder} lacks {', '.join(missing)}: run "
                             f"`python scripts/prepare_data.py --data-dir {args.data_dir}`")
    env_workers = os.environ.get("DMLC_NUM_WORKER")
    if env_workers and env_workers != str(args.workers):
        raise UsageError(f"DMLC_NUM_WORKER={env_workers} in the environment does not match "
                             f"--workers {args.workers}; unset it or make them agree")
    if args.backend == "local" and any(d != "cpu" for d in device_list(args.devices,
                                                                          args.workers)):
        import mxnet as mx
        gpus = mx.context.num_gpus()
        for d in device_list(args.devices, args.workers):
            if d != "cpu" and int(d[3:]) >= gpus:
                raise UsageError(f"argument --devices: {d} asked for, but this machine has "
                                     f"{gpus} GPU(s); use cpu")
    folder = runlayout.mode_dir(args)
    if runlayout.any_round_logs(folder) and not (args.overwrite or args.resume):
        raise UsageError(f"{folder} already holds logs of an earlier run; choose another "
                             "--log-dir, or pass --overwrite (replace) or --resume (continue)")
    if args.resume:
        from esync.common.checkpoint import CheckpointError, CheckpointStore
        try:
            found = CheckpointStore(runlayout.checkpoints_dir(folder)).latest(network=args.network)
        except CheckpointError as exc:
            raise UsageError(f"--resume: {exc}") from None
        if found is None:
            raise UsageError(f"--resume: no checkpoint in {runlayout.checkpoints_dir(folder)}")
        # The evaluator starts before rank 0: it must not see the last run's end marker.
        CheckpointStore(runlayout.checkpoints_dir(folder)).clear_done()
    if args.overwrite:
        for sub in (runlayout.checkpoints_dir(folder), runlayout.processes_dir(folder)):
            shutil.rmtree(sub, ignore_errors=True)
        for path in (runlayout.evaluations_file(folder), runlayout.state_db(folder),
                     runlayout.links_file(folder)):
            path.unlink(missing_ok=True)


