"""esync-cluster's command line: every flag of main.py plus the cluster's, checked at once.

``parse`` returns the resolved namespace, final before anything starts: paths made absolute, the
backend's placement turned into ``--workers``/``--devices``, one slow-down factor per worker.
Nothing downstream changes it; each job derives what it needs from it.
"""
import argparse
import os
import shutil
import sys
from pathlib import Path

from esync import cli
from esync.common import runlayout
from esync.common.argtypes import (HelpFormatter, UsageParser, bounded_number, non_negative_int,
                                   port, positive_int, slowdown_factors)
from esync.common.errors import UsageError
import esync.launch.remote as remote
from esync.launch.backends.netns import add_network_args, layout_from_args

# The main job's defaults differ from main.py's (which keep the original's): a small network that
# trains in minutes on a CPU, learning rates that suit it, and a time budget. Learning rates have
# the original's meaning (x the gradient summed over the batch): 0.05 / 64 is a step of 0.05 on
# the mean gradient of a 64-sample batch.
CLUSTER_LR = 0.05 / 64
# ESync's aggregation depends on the data split (AGGREGATION_BY_SPLIT). main.py keeps the
# original's plain mean; `--aggregation mean --outer-momentum 0 --no-nesterov -gl 1` here too.
# Rounds last one slowest iteration (the original's) or, on i.i.d. data over links that cost, are
# stretched so that the exchange takes at most 20% of a round (rank-32 deltas, the default there)
# or 10% (deltas in full), up to 5 s (COMM_SHARE_*, below; docs/ALGORITHM.md, "Rounds sized by
# compute and transfer").
CLUSTER_DEFAULTS = dict(network="lenet", cpu=1, learning_rate=CLUSTER_LR, local_lr=None,
                        eval_duration=10, max_seconds=90.0, mode="esync",
                        aggregation=None, outer_momentum=None, nesterov=None, global_lr=None,
                        outer_adam=None,
                        comm_share=None, max_round_seconds=5.0, overlap=None, comm_dtype=None,
                        low_rank=None, accumulate=None, carry=None)
# ESync's aggregation by data split, each the best ESync row of a repeated benchmark:
# - i.i.d. (docs/benchmark/report.md): deltas weighted by k_i, DiLoCo's outer Nesterov momentum
#   0.9 and outer learning rate 0.7;
# - by class (no outer momentum: with Nesterov 0.9 a 2-worker -s 1 cluster ends at chance):
#   sum on both by-class splits: -s 1, docs/benchmark-byclass-fixed (3 repeats, one rate):
#   0.287 (0.281-0.318) after 40 s against mean's 0.260 (fednova, the earlier default, 0.233 in
#   the 2026-11-24 default benchmark), still below ASGD's 0.450;
#   -s 2, docs/benchmark-byclass-sum-shuffled: 0.78 against weighted's 0.71 (the earlier
#   default), above it at 8 of the 10 checkpoints (one repeat); then with heavy-ball outer
#   momentum 0.5 (docs/benchmark-byclass-s2-momentum, 3 repeats): final 0.821 (0.714-0.821)
#   against 0.781 (0.714-0.783), the best checkpoint higher in every repeat. On -s 1 the same
#   momentum ended lower (docs/benchmark-byclass-s1-momentum: 0.364 against 0.460), so -s 1
#   keeps none. Since 2026-11-29 -s 2 takes Adam as the outer step (FedAdam: beta1 0.9, step
#   size -gl 0.01) with -ll 3e-04, docs/benchmark-byclass-s2-adam (3 repeats, 120 s): final
#   0.877 (0.840-0.891) and 0.867 over the second half, against heavy-ball momentum 0.5's 0.855
#   and 0.832, ASGD's 0.809 and 0.850, DC-ASGD's 0.855 and 0.837 and SSGD's 0.833 and 0.811,
#   one after the other (docs/RESULTS.md, "Adam as the outer step on class shards").
# - -s 1 also accumulates its local iterations' gradients at the round's model (--accumulate),
#   with -ll 9.5e-05: docs/benchmark-accumulate-s1 and the default benchmark of 2026-11-25,
#   night (docs/benchmark-2026-11-25-night), where it ended well above plain sum; over 120 s
#   (docs/benchmark-byclass-s1-120s and -seeds456, 3 repeats each) it ends above ASGD and
#   DC-ASGD (0.590 and 0.595 against at most 0.557). The default benchmark's by-class tuning
#   (40 s runs over 3e-05..0.001) chooses 9.5e-05 too, and there it ends at 0.603 against
#   ASGD's 0.558 (docs/benchmark-2026-11-26-early); 15 s runs chose 9.5e-06, which ends at 0.423
#   (docs/benchmark-2026-11-26-morning): a 15 s run on -s 1 cannot rank rates for a rule that
#   takes one step per round.
#   -ll elsewhere: CLUSTER_LR.
ADAM_GLOBAL_LR = 0.01    # -gl under --outer-adam when the split's default is another outer step
AGGREGATION_BY_SPLIT = {
    0: dict(aggregation="weighted", outer_momentum=0.9, nesterov=True, outer_adam=False,
            global_lr=0.7, accumulate=False, local_lr=CLUSTER_LR),
    1: dict(aggregation="sum", outer_momentum=0.0, nesterov=False, outer_adam=False,
            global_lr=1.0, accumulate=True, local_lr=9.5e-05),
    2: dict(aggregation="sum", outer_momentum=0.9, nesterov=False, outer_adam=True,
            global_lr=ADAM_GLOBAL_LR, accumulate=False, local_lr=3e-04),
}
# --comm-share and --overlap by data split and link. By-class shards (-s 1, -s 2) keep rounds of
# one slowest iteration and no overlap, since every extra local step on one device's classes is
# drift (FedAvg's local-epochs trade-off; a 2-worker -s 1 cluster test fell to chance with
# stretched rounds) and a one-round-late aggregate is one more round of it. On i.i.d. shards:
# - links to other machines, or shaped ones, with the deltas as rank-32 factors (the default
#   there, LOW_RANK_COSTLY_LINKS): rounds stretched until the exchange takes at most 20% of a
#   round, not overlapped (the fast devices carry through it). docs/benchmark-stretched-shaped
#   (3 repeats, 39 Mbit links): the devices compute 0.90 of the time (the x8 device 0.77, as the
#   last to push it waits for two round trips of factors) against 0.81 in rounds of one slowest
#   iteration, and reach 0.85 in 22.9 s against 19.5 s; docs/benchmark-stretched-shaped-seeds11
#   (5 more seeds): 0.906, 0.85 in 25.5 s, 1.55x sooner than one device alone;
# - the same links with the deltas in full (--low-rank 0): rounds stretched until the exchange
#   takes at most 10% of a round, and the exchange overlapped with the next round
#   (docs/benchmark-fp16: with float16 deltas 0.85 in 22.9 s against 26.2 s for one device on
#   69 Mbit links);
# - free links (every process on this machine, no rate): rounds of one slowest iteration, no
#   overlap. docs/benchmark-loopback-rounds (3 repeats): 0.85 in 12.9 s (12.7-16.6) against
#   16.8 s (16.5-17.3) overlapped, 19.0 s stretched to 10%, ASGD 20.9 s (20.4-24.1): where the
#   exchange costs little, a shorter round (less drift) and a fresh aggregate are worth more
#   than the compute an overlap or a longer round adds.
COMM_SHARE_IID, COMM_SHARE_LOW_RANK = 0.1, 0.2
COMM_SHARE_FREE_LINKS, COMM_SHARE_BY_CLASS = 1.0, 1.0
OVERLAP_IID, OVERLAP_FREE_LINKS, OVERLAP_BY_CLASS = True, False, False
# --comm-dtype by link: float16 deltas where the launcher shapes the links (--net netns with a
# rate), float32 otherwise. docs/benchmark-fp16 (3 repeats, i.i.d.): on 69 Mbit links float16
# reached 0.85 in 22.9 s (21.9-23.1) against 25.5 s (24.5-26.9); on loopback it saves nothing
# and its casts cost the x8 device (20.9 s (16.9-21.5) against 16.8 s (16.7-20.6)).
COMM_DTYPE_SHAPED, COMM_DTYPE_FREE = "float16", "float32"
# --low-rank on i.i.d. data over links that cost (shaped, or other machines'): the deltas as
# PowerSGD factors of rank 32, not overlapped (lenet: 17% of the model's bytes per exchange).
# Three screens on 115 Mbit links, in rounds of one slowest iteration, 3 repeats each, times to
# 0.85: docs/benchmark-lowrank-shaped: rank 8 11.0 s (10.7-11.7), overlapped float16 deltas (the
# previous default) 12.8 s (11.4-13.2), rank 4 13.2 s, rank 2 31.6 s, one device alone 15.7 s;
# docs/benchmark-lowrank-shaped-16: rank 16 8.8 s (8.5-10.6), rank 8 11.4 s;
# docs/benchmark-lowrank-shaped-32: rank 32 8.9 s (8.0-10.7), rank 16 10.5 s (9.5-13.1), one
# device alone 15.3 s (15.2-17.4): 1.72x. Left at 0 where the user asks for what it cannot run
# with (--overlap, --comm-dtype float16, --scaffold, --collective allreduce).
LOW_RANK_COSTLY_LINKS = 32
# --carry on i.i.d. data wherever the exchange is not overlapped: the fast devices compute
# through it. docs/benchmark-carry-shaped (3 repeats, 118 Mbit links, rank-32 deltas): 0.85 in
# 8.0 s (7.7-10.2) against 10.3 s (8.8-11.9), 1.90x sooner than one device instead of 1.47x; the
# x1 devices compute 0.91 of the time instead of 0.65. On free links it gained nothing while the
# x1 devices had 0.63 of a core and the rest of the job half a core (docs/benchmark-carry-
# loopback); with the 0.8-core reserve (a x1 device at 0.5) it does: docs/benchmark-carry-
# loopback-0.5, 0.85 in 13.2 s (12.6-15.5) against 14.4 s (14.2-14.9), a x1 device at 0.97 of one
# device alone instead of 0.89, the cluster at 0.95 of its limit instead of 0.87. Off on by-class
# data (not measured; every carried iteration is one more step on one device's classes).
CARRY_COSTLY_LINKS, CARRY_FREE_LINKS, CARRY_BY_CLASS = True, True, False
STATE_SERVER_RESTARTS = 3        # a state server that keeps dying is a failure, not a blip
DEFAULT_SLOWDOWN = "1,1,4,8"      # the emulated cluster: two fast, one 4x, one 8x slower
LOCAL_ADDRESS = "127.0.0.1"       # the local backend's one host
LAUNCHER_ONLY = {"emulation", "cpu_share", "no_cpu_pinning", "speed_schedule",
                 "workers", "slowdown_list", "devices", "servers", "threads", "port", "state_port",
                 "no_evaluator", "no_summary", "quiet", "stall_timeout", "startup_timeout",
                 "restarts", "net", "hosts", "bandwidth", "server_bandwidth"}
# Set per role by the plan (the state server's address, each worker's host) or passed in the
# environment (the token: never on a command line, where `ps` shows it).
PLANNED = {"state_server_ip", "state_server_port", "host_name", "state_token", "local_iters"}


def local_iters_list(text: str) -> tuple[int, ...]:
    """--local-iters of esync-cluster: one k for every worker, or one per worker."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of local iterations >= 0, or one per worker "
            "(comma-separated)")
    return values


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
                         formatter_class=HelpFormatter)
    cli.add_training_args(parser)
    cli.add_run_args(parser, one_worker=False)
    parser.set_defaults(**CLUSTER_DEFAULTS)
    for flag, dest in (("--aggregation", "aggregation"), ("--outer-momentum", "outer_momentum"),
                       ("-gl", "global_lr"), ("-ll", "local_lr")):
        action = parser._option_string_actions[flag]
        action.help += " (default by data split: " + ", ".join(
            f"-s {split}: {values[dest]:g}" if isinstance(values[dest], float)
            else f"-s {split}: {values[dest]}" for split, values in AGGREGATION_BY_SPLIT.items()
        ) + ")"
    parser._option_string_actions["--accumulate"].help += (
        " (default: on for -m esync on -s 1, off otherwise)")
    parser._option_string_actions["--nesterov"].help += (
        " (default: on with the outer momentum of -s 0, off on by-class data)")
    parser._option_string_actions["--outer-adam"].help += (
        " (default: on for -m esync on -s 2 unless --outer-momentum, --nesterov or -gl is "
        "given, off otherwise)")
    parser._option_string_actions["--comm-share"].help = (
        "the state server stretches rounds so that the measured exchange takes at most this "
        f"share of a round (default by data split and link: {COMM_SHARE_IID:g} on i.i.d. data "
        "over shaped links or other machines' links with deltas in full (--low-rank 0), "
        f"{COMM_SHARE_LOW_RANK:g} there with --low-rank, "
        f"{COMM_SHARE_FREE_LINKS:g} (rounds of one slowest iteration) over free links "
        "(--net loopback, or netns without a rate), "
        f"{COMM_SHARE_BY_CLASS:g} with -s 1 or -s 2, where longer rounds are more drift)")
    parser._option_string_actions["--overlap"].help += (
        f" (default by data split and link: {'on' if OVERLAP_IID else 'off'} on i.i.d. data "
        "over shaped links or other machines' links with --low-rank 0, "
        f"{'on' if OVERLAP_FREE_LINKS else 'off'} over free links or with --low-rank, "
        f"{'on' if OVERLAP_BY_CLASS else 'off'} with -s 1 or -s 2)")
    parser._option_string_actions["--comm-dtype"].help += (
        f" (default by link: {COMM_DTYPE_SHAPED} for -m esync with --low-rank 0 over --net "
        f"netns with a --bandwidth or --server-bandwidth, {COMM_DTYPE_FREE} otherwise)")
    parser._option_string_actions["--low-rank"].help += (
        f" (default by data split and link: {LOW_RANK_COSTLY_LINKS} for -m esync on i.i.d. "
        "data over shaped links or other machines' links, unless --overlap, --comm-dtype "
        "float16, --scaffold or --collective allreduce is given; 0 otherwise)")
    parser._option_string_actions["--carry"].help += (
        f" (default by data split and link: {'on' if CARRY_FREE_LINKS else 'off'} for -m "
        f"esync on i.i.d. data over free links, {'on' if CARRY_COSTLY_LINKS else 'off'} over "
        "shaped links or other machines' links where the exchange is not overlapped (with the "
        "rank-32 deltas; --overlap, the default with --low-rank 0 there, and --local-iters "
        f"exclude it); {'on' if CARRY_BY_CLASS else 'off'} with -s 1 or -s 2)")
    local_iters = parser._option_string_actions["--local-iters"]
    local_iters.type, local_iters.default = local_iters_list, ()
    local_iters.help = ("fixed local iterations per round, bypassing the state server: one "
                        "number for every worker or one per worker, e.g. 2,8 (default: ask it)")
    g = parser.add_argument_group("cluster")
    g.add_argument("--workers", type=positive_int, default=4, help="number of workers")
    g.add_argument("--slowdown", dest="slowdown_list", default=None,
                   help="slow-down factor per worker, comma-separated, or one for all "
                        "(default: 1,1,4,8 with 4 workers, else 1)")
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
    """Parse and check every flag; a bad one raises UsageError before anything is started."""
    args = parser.parse_args(argv)
    # Every process gets absolute paths: workers run from the repository, the state server
    # from state_server/, the user from anywhere.
    args.log_dir = str(Path(args.log_dir).resolve())
    args.data_dir = str(Path(args.data_dir).resolve())
    args.tensorboard = str(Path(args.tensorboard or runlayout.mode_dir(args)).resolve())
    placed = remote.placed_devices(args, sys.argv[1:] if argv is None else list(map(str, argv)))
    if placed is not None:               # ssh and Slurm place the workers themselves
        args.workers, args.devices = len(placed), ",".join(placed)
        if args.slowdown_list is None:
            args.slowdown_list = "1"
    if args.backend != "local" and args.net != "loopback":
        raise UsageError(f"--net {args.net} emulates hosts on this machine: it needs "
                             f"--backend local, not --backend {args.backend}")
    shaped = args.net == "netns" and bool(args.bandwidth or args.server_bandwidth)
    free_links = args.backend == "local" and not shaped     # every process here, no rate
    if args.low_rank is None:
        args.low_rank = _default_low_rank(args, free_links)
    # Low-rank deltas make an exchange cost a few percent of the model: not overlapped (the fast
    # devices carry through it), in rounds stretched less than full deltas' where links cost.
    cheap_exchange = free_links or bool(args.low_rank)
    if args.comm_share is None:
        args.comm_share = (COMM_SHARE_BY_CLASS if args.split_by_class
                           else COMM_SHARE_FREE_LINKS if free_links
                           else COMM_SHARE_LOW_RANK if args.low_rank else COMM_SHARE_IID)
    if args.overlap is None:
        args.overlap = (OVERLAP_BY_CLASS if args.split_by_class
                        else OVERLAP_FREE_LINKS if cheap_exchange else OVERLAP_IID)
    if args.carry is None:
        wanted = (CARRY_BY_CLASS if args.split_by_class
                  else CARRY_FREE_LINKS if free_links else CARRY_COSTLY_LINKS)
        args.carry = wanted and cli.carry_conflict(args) is None
    if args.comm_dtype is None:
        args.comm_dtype = (COMM_DTYPE_SHAPED if shaped and args.mode == "esync"
                           and not args.low_rank else COMM_DTYPE_FREE)
    _aggregation_for_split(args)
    if args.slowdown_list is None:
        args.slowdown_list = DEFAULT_SLOWDOWN if args.workers == 4 else "1"
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
        from esync.common.speeds import ScheduleError, parse_speed_schedule
        from esync.launch.roles import device_names
        try:
            parse_speed_schedule(args.speed_schedule,
                                 devices=device_names(device_list(args.devices, args.workers)))
        except ScheduleError as exc:
            raise UsageError(f"argument --speed-schedule: {exc}") from None
    if args.backend != "kubernetes":          # the pods check their own data and logs
        check_before_start(args)
    return args


def _default_low_rank(args, free_links: bool) -> int:
    """PowerSGD factors where the links cost and nothing the user asked for excludes them."""
    if args.split_by_class or free_links or cli.low_rank_conflict(args):
        return 0
    return LOW_RANK_COSTLY_LINKS


def _aggregation_for_split(args) -> None:
    """Fill what the user left out of ESync's aggregation with the data split's defaults; a
    momentum given without --nesterov keeps Nesterov only when the split's default has it."""
    defaults = AGGREGATION_BY_SPLIT[args.split_by_class]
    if args.outer_adam is None:   # the split's outer step, unless the user chose another's parts
        args.outer_adam = defaults["outer_adam"] and all(
            getattr(args, dest) is None for dest in ("outer_momentum", "nesterov", "global_lr"))
    if args.global_lr is None and args.outer_adam != defaults["outer_adam"]:
        # -gl is Adam's step size, or a momentum's outer learning rate: not the other's default
        args.global_lr = ADAM_GLOBAL_LR if args.outer_adam else 1.0
    for dest in ("aggregation", "outer_momentum", "global_lr", "local_lr"):
        if getattr(args, dest) is None:
            setattr(args, dest, defaults[dest])
    if args.nesterov is None:
        args.nesterov = bool(defaults["nesterov"] and args.outer_momentum
                             and not args.outer_adam)
    if args.accumulate is None:         # not where a flag given needs local steps
        args.accumulate = defaults["accumulate"] and cli.accumulate_conflict(args) is None


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
    from esync.worker.data import FASHION_FILES, FASHION_SUBDIR
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
        from esync.worker.checkpoint import CheckpointError, CheckpointStore
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


