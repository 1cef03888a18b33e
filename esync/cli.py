"""Command line of ``main.py``: the original ESync's flags (defaults from ``config.py``) plus ours.

The flags only: ``esync.entry`` runs the role they start, and the launcher builds its own
command line on these groups, so nothing here imports the worker (or MXNet).

Bad values end with one ``error:`` line naming the flag, never a traceback.
"""
import argparse
import math
import os
import socket
import sys

import config
from esync.common import esync_parts
from esync.common.argtypes import (UsageParser, bounded_number, fraction, non_negative_float,
                                   non_negative_int, port, positive_float, positive_int, typed)
from esync.common.catalog import NETWORKS
from esync.common.collectives import COLLECTIVES
from esync.common.errors import UsageError
from esync.common.modes import AGGREGATION_RULES, COMM_DTYPES, SPLIT_VALUES, SPLITS
from esync.common.runlayout import ROUND_LOG_PATTERN

DMLC_ROLES = ("scheduler", "server", "worker", "evaluator")


_slowdown = bounded_number(float, low=1, must=">= 1 (a device F times slower)")
_momentum = bounded_number(float, low=0, high=0.999, must="a momentum in [0, 0.999]")
_sgd_momentum = bounded_number(float, low=0, high=0.999,
                               must="a momentum in [0, 1): 0 (plain SGD) to 0.999; 0.9 is usual")
_comm_share = bounded_number(float, low=0, strict=True, high=1, must="a share in (0, 1]")
_beta2 = bounded_number(float, low=0, high=0.9999, must="a decay in [0, 0.9999]")
_tau = bounded_number(float, low=0, strict=True, high=1, must="a number in (0, 1]")
_round_bound = bounded_number(float, low=0, high=3600, must="seconds in [0, 3600]")
_ratio = bounded_number(float, low=2, high=1e6, must="0 or a ratio in [2, 1e6], e.g. 16")


def _sit_out_ratio(text):
    """``--sit-out-ratio``: 0 (nobody sits out) or a ratio of at least 2."""
    return 0.0 if text.strip() in ("0", "0.0") else _ratio(text)


def _flag01(text):
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"must be 0 or 1, got {text}")
    return int(text)


def _dcasgd(text):
    if text not in ("0", "1", "2"):
        raise argparse.ArgumentTypeError(f"must be 0, 1 or 2, got {text}")
    return int(text)


def _split(text):
    if text not in {str(k) for k in SPLIT_VALUES}:
        raise argparse.ArgumentTypeError(f"must be {', '.join(map(str, SPLIT_VALUES))}, got "
                                         f"{text}")
    return int(text)


def _speed_schedule(text):
    from esync.emulation.schedules import ScheduleError, parse_speed_schedule
    try:
        parse_speed_schedule(text)
    except ScheduleError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("speed schedule: ")) from None
    return text


def _eval_every(text):
    """``auto``, a number of rounds, or seconds of training (``5s``) as a float."""
    if text == "auto":
        return text
    if text.endswith("s"):
        seconds = typed(float, text[:-1], "'auto', rounds, or seconds such as 5s")
        if not (seconds > 0 and math.isfinite(seconds)):
            raise argparse.ArgumentTypeError(f"must be 'auto', rounds, or seconds > 0 such as "
                                             f"5s, got {text}")
        return EverySeconds(seconds)
    return positive_int(text)


class EverySeconds(float):
    """-e in seconds of training; spelled ``5s`` again when a launcher passes it on."""

    def __str__(self) -> str:
        return f"{float(self):g}s"


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


def _epsilon(text):
    if text == "auto":
        return text
    value = typed(float, text, "'auto' or seconds")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or seconds >= 0, got {text}")
    return value


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """The original ESync's flags, same short and long names, defaults from config.py."""
    g = parser.add_argument_group("training (the original ESync's flags)")
    g.add_argument("-l", "--learning-rate", type=positive_float, default=config.learning_rate,
                   help="SGD learning rate of sync, async, dcasgd and local modes; as in the "
                        "original, a step is lr x the gradient SUMMED over the batch (lr 0.05 on "
                        "the batch mean with -b 64 is -l 0.00078125)")
    g.add_argument("--momentum", type=_sgd_momentum, default=config.momentum,
                   help="SGD momentum of sync, async, dcasgd and local modes (ASGD and DC-ASGD: "
                        "the server's optimizer, on every gradient as it arrives; SSGD: on the "
                        "summed gradient, the same on every worker; with --nesterov, Nesterov's "
                        "form; not checkpointed: --resume starts it afresh in sync and local); "
                        "ESync's momentum is --outer-momentum")
    g.add_argument("-ll", "--local-lr", type=positive_float, default=config.local_lr,
                   help="learning rate of ESync's local iterations, times the gradient summed "
                        "over the batch (as -l)")
    g.add_argument("-gl", "--global-lr", type=positive_float, default=config.global_lr,
                   help="ESync's global (outer) learning rate: params = start + gl * "
                        "aggregated delta (see --aggregation, --outer-momentum)")
    g.add_argument("-b", "--batch-size", type=positive_int, default=config.batch_size,
                   help="samples per iteration on each device")
    g.add_argument("-dd", "--data-dir", default=config.data_dir,
                   help="folder holding fashion-mnist/ (prepare: python scripts/prepare_data.py)")
    g.add_argument("-g", "--gpu", type=non_negative_int, default=config.gpu, help="GPU id")
    g.add_argument("-c", "--cpu", type=_flag01, default=config.cpu, help="1: train on the CPU")
    g.add_argument("-n", "--network", default=config.network, choices=list(NETWORKS),
                   metavar="NETWORK", help=f"one of {', '.join(NETWORKS)}")
    g.add_argument("-ld", "--log-dir", default=config.log_dir,
                   help="logs go to LOG_DIR/NETWORK/MODE/HOST/DEVICE/" + ROUND_LOG_PATTERN)
    g.add_argument("-e", "--eval-duration", type=_eval_every, default=config.eval_duration,
                   help="evaluate (checkpoint) every this many rounds, or every this much "
                        "training time with an s (5s: the first round ending 5 s or more after "
                        "the last checkpoint; rounds of different lengths, one grid in time); "
                        "'auto': every round in a cluster, and in -m local as often as keeps "
                        "scoring the test set to about 10%% of the wall time")
    g.add_argument("-m", "--mode", default=config.mode, choices=["esync", "sync", "async", "local"],
                   help="synchronization algorithm")
    g.add_argument("-dcasgd", "--use-dcasgd", type=_dcasgd, default=config.use_dcasgd,
                   help="with -m async: 1: DC-ASGD as published (Zheng et al. 2017: each "
                        "worker compensates its gradient with the model it computed it on, the "
                        "server runs SGD; one extra model pull per step); 2: MXNet's DCASGD "
                        "optimizer on the server (one previous weight per key, overwritten by "
                        "every worker's update: a stale gradient is corrected for one update "
                        "only; logs to dcasgd-mxnet)")
    g.add_argument("--dcasgd-lambda", type=non_negative_float, default=config.dcasgd_lambda,
                   help="DC-ASGD's lambda, on the batch-summed gradient: the paper's lambda "
                        "(defined on the mean gradient) divided by the batch size; 0: no "
                        "compensation")
    g.add_argument("--collective", choices=COLLECTIVES, default="ps",
                   help="how workers combine their arrays: ps, the parameter server (MXNet's "
                        "dist KVStore, ps-lite; every mode) or allreduce, Horovod's ring "
                        "allreduce over Gloo (-m esync and -m sync; no server, each link carries "
                        "2(N-1)/N x the model per exchange; workers started by horovodrun or "
                        "esync-cluster)")
    g.add_argument("-s", "--split-by-class", type=_split, default=config.split_by_class,
                   help="; ".join(f"{s.value}: {s.description}" for s in SPLITS))
    g.add_argument("-ip", "--state-server-ip", default=config.state_server_ip,
                   help="ESync state server host")
    g.add_argument("-port", "--state-server-port", type=port,
                   default=int(config.state_server_port), help="ESync state server port")


def add_run_args(parser: argparse.ArgumentParser, *, one_worker: bool = True) -> None:
    """Stopping, seeds, logs and ESync options; `one_worker` adds the per-device flags."""
    g = parser.add_argument_group("stopping, reproducibility and emulation")
    g.add_argument("--max-rounds", type=non_negative_int, default=config.max_rounds,
                   help="stop after this many rounds (0: no limit)")
    g.add_argument("--max-seconds", type=non_negative_float, default=config.max_seconds,
                   help="stop after this much wall time, then evaluate once more (0: no limit)")
    g.add_argument("--max-train-seconds", type=non_negative_float, default=0.0,
                   help="stop after this much training time: the logs' total_time, which in "
                        "-m local leaves out the inline scoring of the test set (0: no limit)")
    g.add_argument("--target-accuracy", type=fraction, default=config.target_accuracy,
                   help="stop once the test accuracy reaches this (0: never)")
    g.add_argument("--inline-eval", action=argparse.BooleanOptionalAction, default=True,
                   help="rank 0 scores the test set every -e rounds between two rounds, prints "
                        "'[Iteration N] Test Acc' and logs the accuracy in its round log, as "
                        "the original did (in sync and esync every worker waits for it); give "
                        "--no-inline-eval where an evaluator (DMLC_ROLE=evaluator) scores rank "
                        "0's checkpoints off the critical path instead. esync-cluster starts "
                        "that evaluator and gives its workers --no-inline-eval (with "
                        "--no-evaluator nothing scores unless --inline-eval is given)")
    g.add_argument("--seed", type=non_negative_int, default=config.seed,
                   help="data partition, shuffling and initial weights")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run's logs in the same folder")
    g.add_argument("--resume", action="store_true",
                   help="continue from the last checkpoint in the log folder")
    if one_worker:
        g.add_argument("--slowdown", type=_slowdown, default=config.slowdown,
                       help="emulate a device this many times slower (see --emulation)")
        g.add_argument("--emulation", choices=["sleep", "cpu-cap"], default="sleep",
                       help="how --slowdown is emulated: sleep waits (F-1)x each iteration's "
                            "compute; cpu-cap means a launcher caps this process's CPU (it "
                            "only records F)")
        g.add_argument("--speed-schedule", type=_speed_schedule, default=None,
                       metavar="SPEC",
                       help="the device's factor changes during training, e.g. "
                            "'cpu1:1@0,6@30' (this device's entry is used; see esync-cluster)")
        g.add_argument("--shard", type=non_negative_int, default=None,
                       help="train on this shard of the data (default: the KVStore rank); "
                            "a launcher pins each device to its shard")
        g.add_argument("--device-name", default=None,
                       help="log folder name of this device (default gpuN, or cpuRANK)")
        g.add_argument("--writes-checkpoints", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="this worker writes (or not) the checkpoints the evaluator scores "
                            "(default: rank 0; in async modes esync-cluster names its fastest "
                            "device, whose rounds come most often)")
    g.add_argument("--host-name", default=socket.gethostname(),
                   help="log folder name of this host")
    g.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="write TensorBoard scalars into DIR: rank 0's loss, throughput, k_i and "
                        "computing-time ratio, the evaluator's test accuracy (esync-cluster: "
                        "the job's log folder)")
    e = parser.add_argument_group("ESync")
    e.add_argument("--policy", choices=["dynamic", "planned"], default=config.policy,
                   help="state-server policy: one request per local iteration (dynamic) or "
                        "one per round (planned)")
    e.add_argument("--epsilon", type=_epsilon, default=config.epsilon,
                   help="slack of the state server: 'auto' (relative to iteration time) or "
                        "absolute seconds as in the original")
    if one_worker:
        e.add_argument("--local-iters", type=non_negative_int, default=0,
                       help="fixed local iterations per round, bypassing the state server "
                            "(0: ask it)")
    else:
        e.add_argument("--local-iters", type=local_iters_list, default=(),
                       help="fixed local iterations per round, bypassing the state server: one "
                            "number for every worker or one per worker, e.g. 2,8 (default: ask "
                            "it)")
    e.add_argument("--aggregation", choices=AGGREGATION_RULES,
                   default=config.aggregation,
                   help="how the workers' deltas are combined: mean (the original; weights "
                        "objective i by k_i), weighted (deltas x k_i: objectives by k_i^2, best "
                        "on i.i.d. data), fednova (each delta / k_i, rescaled by the mean "
                        "k: every objective equally), or sum (every delta in full, as ASGD "
                        "applies every gradient: mean with N times the step, best on by-class "
                        "data)")
    e.add_argument("--outer-momentum", type=_momentum, default=config.outer_momentum,
                   help="momentum on the aggregated delta, with -gl as the outer learning rate "
                        "(DiLoCo: 0.9 with --nesterov and -gl 0.7; 0: none)")
    e.add_argument("--nesterov", action=argparse.BooleanOptionalAction, default=config.nesterov,
                   help="Nesterov form of the momentum: ESync's --outer-momentum; in the other "
                        "modes their --momentum")
    e.add_argument("--outer-adam", action=argparse.BooleanOptionalAction,
                   default=config.outer_adam,
                   help="Adam as the outer step (FedAdam): --outer-momentum is its beta1, -gl "
                        "its step size (a coordinate moves by about -gl a round or less: "
                        "0.01 on shuffled class shards)")
    e.add_argument("--outer-beta2", type=_beta2, default=config.outer_beta2,
                   help="--outer-adam: the decay of its second moment")
    e.add_argument("--outer-epsilon", type=_tau, default=config.outer_epsilon,
                   help="--outer-adam: tau, added to the root of the second moment")
    e.add_argument("--comm-share", type=_comm_share, default=config.comm_share,
                   help="the state server stretches rounds so that the exchange takes at most "
                        "this share of a round (measured transfer times; 1: rounds sized by "
                        "compute alone, as the original)")
    e.add_argument("--max-round-seconds", type=_round_bound,
                   default=config.max_round_seconds,
                   help="bound on a round's duration when --comm-share stretches it (0: none)")
    e.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=config.overlap,
                   help="exchange round r's deltas while round r+1 computes (the global model "
                        "moves one round late; each worker goes on from it plus its own delta)")
    e.add_argument("--carry", action=argparse.BooleanOptionalAction, default=config.carry,
                   help="a device that would wait at the exchange for the slowest (at least "
                        "twice as fast as it, or told so by the state server) runs local "
                        "iterations while its round's exchange is in flight and carries them "
                        "into its next delta (hides the exchange's wait without delaying the "
                        "global model, unlike --overlap)")
    e.add_argument("--carry-slowest", action=argparse.BooleanOptionalAction,
                   default=config.carry_slowest,
                   help="with --carry under --policy dynamic, the slowest device carries too: "
                        "its iterations during the exchange start its next round (computed on "
                        "its model of the round before, its next round's first question sent "
                        "as it starts): more computing, more iterations a round stale (measured "
                        "slower to the target: docs/results/)")
    e.add_argument("--sit-out-ratio", type=_sit_out_ratio, default=config.sit_out_ratio,
                   metavar="R",
                   help="under --policy dynamic, a device whose iteration takes more than R "
                        "times the fastest device's (measured in the first round) sits out: "
                        "it computes nothing and pushes empty deltas, and the others' rounds "
                        "last 8 of the fastest device's iterations instead of one of its own "
                        "(0: every device is waited for, as the original; with --aggregation "
                        "weighted and deltas in full, no --overlap, --scaffold or --accumulate)")
    e.add_argument("--comm-dtype", choices=COMM_DTYPES, default=config.comm_dtype,
                   help="type of the deltas on the wire: float16 halves every exchange's bytes "
                        "(the parameter server sums them in float16; the global model, the "
                        "outer step and the batch-norm statistics stay float32)")
    e.add_argument("--prox-mu", type=non_negative_float, default=config.prox_mu,
                   help="FedProx's proximal term: each local step also descends "
                        "(MU/2)|w - w_round_start|^2 per sample (limits client drift on "
                        "by-class data; 0: none)")
    e.add_argument("--scaffold", action=argparse.BooleanOptionalAction, default=config.scaffold,
                   help="SCAFFOLD's control variates correct each local step for the drift "
                        "between this device's data and everyone's (twice the traffic)")
    e.add_argument("--accumulate", action=argparse.BooleanOptionalAction,
                   default=config.accumulate,
                   help="local iterations sum their gradients at the round's model instead of "
                        "stepping (the delta is -ll x the sum): each round is one SGD step on "
                        "every device's k_i batches, as load-balanced BSP sizes batches by "
                        "speed; no local model drifts towards its own classes")
    e.add_argument("--low-rank", type=non_negative_int, default=config.low_rank,
                   help="PowerSGD: each large delta (a matrix of 4096+ numbers) travels as two "
                        "factors of this rank, in two small exchanges, with error feedback "
                        "(lenet at rank 4: 3%% of the bytes); for slow links; 0: deltas in full")
    e.add_argument("--job", default=os.environ.get("ESYNC_JOB", "default"),
                   help="job id on the state server")
    e.add_argument("--state-token", default=os.environ.get("ESYNC_STATE_TOKEN"),
                   help="the state server's token (default: $ESYNC_STATE_TOKEN)")


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="main.py", description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_training_args(parser)
    add_run_args(parser)
    parser.add_argument("--explain", action="store_true",
                        help="print every resolved option with its source (config.py default "
                             "or user flag) and exit without starting or contacting anything")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """main.py's flags over config.py's defaults (no presets: the original's meaning);
    ``args.resolution`` records each value's source."""
    from esync.common import presets
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(map(str, argv))
    args = parser.parse_args(argv)
    given = presets.given_options(parser, argv)
    args.resolution = presets.resolve(
        {k: v for k, v in vars(args).items() if k not in given},
        presets.Situation(tool="main.py", mode=args.mode, split=args.split_by_class,
                          user=given))
    if args.use_dcasgd and args.mode != "async":
        raise UsageError("argument -dcasgd/--use-dcasgd: needs -m async")
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    if not args.inline_eval and args.mode == "local":
        raise UsageError("--no-inline-eval: -m local writes no checkpoints for an evaluator to "
                         "score, so it scores the test set itself; leave the flag out")
    if args.eval_duration == "auto" and args.mode != "local":
        args.eval_duration = 1    # a cluster checkpoints every round; its evaluator scores them
    check_esync_options(args)
    check_collective(args)
    return args


def check_esync_options(args) -> None:
    """Combinations of ESync flags that cannot work (shared by main.py and esync-cluster; the
    parts' declarations in ``esync.common.esync_parts``), and one that runs but was measured
    not to learn (a warning on stderr)."""
    if (getattr(args, "scaffold", False) and getattr(args, "aggregation", "mean") == "sum"
            and not getattr(args, "outer_momentum", 0)):
        print("warning: --scaffold with --aggregation sum and no outer momentum fell to chance "
              "in one of two measured runs (shuffled class shards, -ll 0.001); with "
              "--outer-momentum 0.5 both learned (docs/results/shuffled-class.md, "
              "\"What did not help on -s 2\")", file=sys.stderr)
    if getattr(args, "momentum", 0) and args.mode == "esync":
        raise UsageError("argument --momentum: it is the SGD momentum of -m sync, async and "
                         "local; ESync's local steps are plain SGD and its momentum is "
                         "--outer-momentum (give --momentum 0 with -m esync)")
    esync_parts.check(args)


def preset_excluded(option: str, values) -> str | None:
    """What in ``values`` a preset's value for ``option`` cannot be combined with, by the parts'
    declarations (``esync.common.esync_parts``; None: nothing): the presets' values yield to it
    (esync.common.presets.resolve)."""
    if option not in esync_parts.OPTIONS or not esync_parts.is_on(option, values):
        return None
    if option == "nesterov" and values.get("mode", "esync") != "esync":
        return f"-m {values['mode']}'s --nesterov shapes its --momentum: the user's to ask for"
    return esync_parts.conflict(option, values)


def check_collective(args) -> None:
    """Only modes without a server of their own run over the allreduce (shared with
    esync-cluster)."""
    from esync.common import modes
    mode = modes.for_cli(args.mode, args.use_dcasgd)
    if args.collective != "ps" and args.collective not in mode.collectives:
        runs = dict.fromkeys(m.cli_mode for m in modes.MODES if args.collective in m.collectives)
        raise UsageError(f"argument --collective: -m {args.mode}"
                         + (f" -dcasgd {args.use_dcasgd}" if args.use_dcasgd else "")
                         + f" cannot run over {args.collective}: "
                         + ("it runs alone, without a collective" if not mode.cluster else
                            "its updates are applied by the parameter server")
                         + f"; --collective {args.collective} runs -m {' and -m '.join(runs)}, "
                         "or leave --collective at ps")


def dmlc_environment(role: str, env=os.environ) -> dict:
    """Check the ps-lite variables a role needs; a bad or missing one is named."""
    if role not in DMLC_ROLES:
        raise UsageError(f"DMLC_ROLE={role!r} is not a role; use one of {', '.join(DMLC_ROLES)}")
    if role == "evaluator":
        return {}
    values = {}
    for name in ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"):
        if not env.get(name):
            raise UsageError(f"environment variable {name} is not set; DMLC_ROLE={role} needs "
                             "DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER")
        values[name] = env[name]
    for name, low in (("DMLC_PS_ROOT_PORT", 1), ("DMLC_NUM_SERVER", 1), ("DMLC_NUM_WORKER", 1)):
        try:
            number = int(values[name])
        except ValueError:
            number = None
        if number is None or number < low or (name.endswith("PORT") and number > 65535):
            raise UsageError(f"environment variable {name}={values[name]!r} must be "
                             + ("a port number 1-65535" if name.endswith("PORT")
                                else "a positive integer"))
    return values
