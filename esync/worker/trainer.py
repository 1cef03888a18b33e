"""The training loop, written once for every mode: stepping, timing, logging, checkpoints, stopping.

A round is: local iterations while the algorithm says so (one for sync/async/local, k_i for
ESync), then the algorithm's aggregation. Everything mode-specific lives in ``esync.worker.algorithms``.

Test accuracy comes from one of two places, which rank 0's first line names:

- inline (``--inline-eval``, main.py's default, as the original): after every ``-e``-th round's
  aggregation rank 0 scores the test set itself, prints ``[Iteration N] Test Acc 0.xyz`` and
  logs the score as ``accuracy`` in that round's log, the time taken as its "evaluation" phase.
  The cost is the original's: one pass over the test set between two rounds. In sync and ESync
  every worker waits for it at the next exchange (the cluster's round is that much longer; in
  a cluster rank 0's ``total_time`` keeps it, as everyone's clock does); in async only rank 0
  is slower. Only the scoring itself is in the way: its dashboard post and TensorBoard scalar
  are written off the training thread. -m local takes the scoring out of the training time.
  Only rank 0 knows the score (no ``evaluations.jsonl`` in a cluster, as the original): sync
  and ESync vote the ``--target-accuracy`` stop together, but in async only rank 0 stops on it.
- the evaluator role (``--no-inline-eval``): ``DMLC_ROLE=evaluator`` scores the checkpoints
  rank 0 writes every ``-e`` rounds in its own process, off every worker's critical path;
  ``esync-cluster`` starts one and tells its workers ``--no-inline-eval``.
"""
import json
import math
import sys
import time
import traceback
from pathlib import Path

import mxnet as mx
from mxnet import autograd, gluon

from esync.worker import data, models
from esync.worker.algorithms import AlgorithmConfig, Worker, algorithm_class
from esync.worker.background import BackgroundWrites
from esync.common import dataset, esync_parts, runlayout
from esync.common.checkpoint import CheckpointError, CheckpointStore
from esync.common.errors import UsageError, guarded
from esync.common.runlayout import EvaluationLog
from esync.common.speeds import (OPERATOR_THREADS, communication_threads,
                                 cap_cores, cap_seconds, capped_cpu_seconds,
                                 cpu_seconds_under_cap, join_cpu_cap, leave_cpu_cap)
from esync.worker.evaluator import accuracy, load_into
from esync.worker.kvstore import Channel, KeyMap, KVChannel, control_length, leave_job_at_once
from esync.common.files import atomic_write_text
from esync.worker.measure import RoundLogWriter, RoundRecord
from esync.worker.score_report import ScoreReport
from esync.worker.tboard import TrainingScalars, forget_earlier_events


COMPUTE_PHASES = ("get_batch", "forward and backward", "local update", "emulated slowdown")


def run(args) -> int:
    """Train; a worker that fails leaves the job at once with its error printed (see below)."""
    try:
        code = guarded(lambda: train(args))
    except KeyboardInterrupt:
        print("main.py: interrupted", file=sys.stderr)
        code = 130
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:       # noqa: B902 - a programming error: its traceback goes to the log
        traceback.print_exc()
        code = 1
    if code != 0 and Channel.joined_job:
        leave_job_at_once(code)   # never sit in an exit barrier waiting for the peers
    return code


# MXNet's CPU context a worker trains on with -c 1. MXNet gives each CPU context its own engine
# threads, and the KVStore runs its push and pull on context 0 (its pinned buffers are there):
# training on context 1 keeps the device's operators and the host's communication on separate
# threads, so that an emulated device's CPU cap holds the first and not the second, as a real
# accelerator computes while its host moves the data (``record_host_engine_threads``).
CPU_DEVICE_ID = 1


def resolve_context(args) -> mx.Context:
    if args.cpu:
        return mx.cpu(CPU_DEVICE_ID)
    available = mx.context.num_gpus()
    if args.gpu >= available:
        raise UsageError(f"argument -g/--gpu: GPU {args.gpu} asked for, but this machine has "
                         f"{available} GPU(s) visible to MXNet; train on the CPU with -c 1")
    return mx.gpu(args.gpu)


class StopCriteria:
    """--max-seconds bounds the wall time; --max-train-seconds the training time.

    The two differ only in standalone mode, where the inline scoring of the test set is taken
    out of the training time (in a cluster every worker's clock includes rank 0's scoring).
    """

    def __init__(self, args):
        self.max_rounds, self.max_seconds = args.max_rounds, args.max_seconds
        self.max_train_seconds = getattr(args, "max_train_seconds", 0.0)
        self.target = args.target_accuracy

    def reached(self, round_no: int, training: float, wall: float, latest_accuracy) -> bool:
        return bool((self.max_rounds and round_no >= self.max_rounds)
                    or (self.max_seconds and wall >= self.max_seconds)
                    or (self.max_train_seconds and training >= self.max_train_seconds)
                    or (self.target and latest_accuracy is not None
                        and latest_accuracy >= self.target))


# Standalone -e auto: score the test set again once the training since the last score is
# this many times the last score's duration, so scoring takes about 1/(1+N) of the wall time.
AUTO_EVAL_TRAIN_PER_EVAL = 9


def record_host_engine_threads() -> None:
    """Start MXNet's engine with one operation on CPU context 0, recording the threads it makes
    as the host's (``communication_threads``): the engine's prioritised pool and context 0's
    operator threads, where the KVStore's push and pull run. Called before any other operation;
    the device's context makes its own threads on its first operation, and those join its CPU
    cap."""
    with communication_threads():
        mx.nd.zeros((1,), ctx=mx.cpu(0)).wait_to_read()


def _connect(algo_cls, args):
    if algo_cls.kvstore_type is None:
        return None, 0, 1
    if getattr(args, "collective", "ps") == "allreduce":
        from esync.worker.allreduce import AllreduceChannel
        with communication_threads():       # Horovod's background loop
            channel = AllreduceChannel(resolve_context(args))
    else:
        with communication_threads():       # ps-lite's and ZeroMQ's threads
            channel = KVChannel(mx.kv.create(algo_cls.kvstore_type))
    return channel, channel.rank, channel.num_workers


def shard_of(args, rank: int, num_workers: int) -> int:
    """The data shard this worker trains on: ``--shard`` (a launcher pins each device to its
    shard, whatever rank ps-lite assigns in registration order), else the KVStore rank."""
    shard = rank if getattr(args, "shard", None) is None else args.shard
    if shard >= num_workers:
        raise UsageError(f"argument --shard: {shard} is not below the number of workers "
                         f"({num_workers})")
    return shard


def _shard(args, shard: int, num_workers: int) -> data.BatchStream:
    images, labels = dataset.load_fashion_mnist(args.data_dir, "train")
    index, shuffle = dataset.training_shard(labels, num_workers, shard, args.split_by_class,
                                         seed=args.seed)
    return data.BatchStream(images[index], labels[index], args.batch_size,
                            models.input_size(args.network), resolve_context(args),
                            seed=args.seed * 1000 + shard, shuffle=shuffle,
                            keep_last=not shuffle)


def _device_name(args, rank: int) -> str:
    if args.device_name:
        return args.device_name
    return f"cpu{rank}" if args.cpu else f"gpu{args.gpu}"


def _start_global_model(worker: Worker, algo, store: CheckpointStore | None, args):
    """Rank 0's model and algorithm state (fresh or from the last checkpoint) become everyone's
    starting point.

    Returns (first round number - 1, training seconds already spent, samples already seen).
    """
    net, state = worker.net, algo.state_arrays()
    start = (0, 0.0, 0)
    if args.resume and store is not None and worker.rank == 0:
        found = store.latest(network=args.network,
                             shapes={k: p.shape for k, p in models.named_parameters(net).items()})
        if found is None:
            raise CheckpointError(f"--resume: no checkpoint in {store.folder}")
        path, meta, arrays = found
        load_into(net, arrays)
        _restore_state(state, store.read_state(path), path)
        store.clear_done()
        start = (int(meta["round"]), float(meta["total_time"]), int(meta.get("samples") or 0))
        print(f"[rank 0] resuming from {path.name} (round {start[0]})", flush=True)
    if worker.channel is None:
        return start
    keys = worker.keys
    values = ([p.data() for p in worker.trainable] + [p.data() for p in worker.aux]
              + list(state.values()) + [mx.nd.zeros(control_length(worker.num_workers)),
                                        mx.nd.array(start)])
    extra = [mx.nd.zeros(shape, ctx=worker.ctx, dtype=dtype) for shape, dtype in algo.extra_keys()]
    all_keys = keys.trainable + keys.aux + keys.state + [keys.control, keys.meta]
    worker.channel.init(all_keys + keys.extra, values + extra)
    worker.channel.pull(all_keys[:-2] + [keys.meta], values[:-2] + [values[-1]])
    worker.channel.bytes_pulled = 0
    first, seconds, samples = values[-1].asnumpy().tolist()
    return int(first), float(seconds), int(samples)


def _restore_state(state: dict, saved: dict, path) -> None:
    """Put the algorithm state of a checkpoint back (e.g. ESync's outer momentum)."""
    for name, array in state.items():
        if name not in saved:
            print(f"[rank 0] {path.name} holds no {name}: it starts from zero", flush=True)
            continue
        if tuple(saved[name].shape) != tuple(array.shape):
            raise CheckpointError(f"checkpoint {path}: {name} has shape {saved[name].shape}, "
                                  f"this run needs {array.shape}")
        array[:] = saved[name]


def train(args) -> int:
    record_host_engine_threads()
    ctx = resolve_context(args)
    algo_cls = algorithm_class(args.mode, args.use_dcasgd)
    if args.resume and algo_cls.kvstore_type is None:
        raise UsageError("--resume continues from a cluster's checkpoints; -m local writes none")
    folder = runlayout.mode_dir(args)
    channel, rank, num_workers = _connect(algo_cls, args)
    shard = shard_of(args, rank, num_workers)
    stream = _shard(args, shard, num_workers)          # bad data fails before any folder is made
    net = models.build(args.network, ctx, seed=args.seed)
    trainable, aux = models.trainable_and_aux(net)
    worker = Worker(config=AlgorithmConfig.from_args(args), ctx=ctx, net=net,
                    trainable=trainable, aux=aux, channel=channel, rank=rank,
                    num_workers=num_workers)
    device = _device_name(args, rank)
    if rank == 0:
        print(f"[rank 0 {device}] {accuracy_source(args)}", flush=True)
    writer = RoundLogWriter(runlayout.device_dir(folder, args.host_name, device), overwrite=args.overwrite,
                            resume=args.resume)
    store = CheckpointStore(runlayout.checkpoints_dir(folder)) if channel is not None else None
    if rank == 0:
        if args.overwrite and not args.resume:
            _forget_earlier_run(folder)
            if args.tensorboard:
                forget_earlier_events(args.tensorboard)
        _write_run_config(folder, args, num_workers)
    _write_json(writer.folder / "config.json", dict(vars(args), rank=rank, device=device,
                                                    shard=shard,
                                                    num_workers=num_workers))
    algo = algo_cls(worker)
    algo.prepare()
    worker.keys = KeyMap(len(trainable), len(aux), len(algo.state_arrays()),
                         len(algo.extra_keys()))
    done_rounds, spent, samples = _start_global_model(worker, algo, store, args)
    spent = max(spent, _logged_time(writer.folder, done_rounds))
    algo.setup()
    loop = TrainingLoop(worker, algo, stream, writer, store, folder, device, args, shard=shard)
    loop.announce(spent)
    return loop.run(done_rounds, spent, samples)


def accuracy_source(args) -> str:
    """Where this run's test accuracy comes from: the first line rank 0 prints."""
    every = args.eval_duration
    if every == "auto":
        when = "as often as keeps the scoring to about 10% of the wall time"
    elif isinstance(every, int):
        when = f"every {every} round(s)"
    else:
        when = f"every {every:g} s of training"
    if args.inline_eval:
        return f"test accuracy scored inline {when} (no evaluator)"
    return (f"test accuracy scored by the evaluator role (DMLC_ROLE=evaluator) from rank 0's "
            f"checkpoints, written {when} (--no-inline-eval)")


def _logged_time(device_folder: Path, round_no: int) -> float:
    """The training time this device logged for ``round_no`` (0.0 if none): on --resume its
    clock goes on from the later of that and the checkpoint's (rank 0's) time, so that its
    own log never steps back in time."""
    if round_no <= 0:
        return 0.0
    try:
        return float(json.loads(runlayout.round_log(device_folder, round_no).read_text())
                     ["total_time"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _forget_earlier_run(folder: Path) -> None:
    """--overwrite: the earlier run's scores and checkpoints must not leak into this one."""
    import shutil
    runlayout.evaluations_file(folder).unlink(missing_ok=True)
    shutil.rmtree(runlayout.checkpoints_dir(folder), ignore_errors=True)


class DeviceSpeed:
    """The emulated device's slow-down factor over training time: ``--slowdown``, changed by
    this device's entry of ``--speed-schedule``. Under ``--emulation sleep`` the worker waits
    (F-1)x each iteration's compute; under ``cpu-cap`` its launcher caps the CPU and the worker
    only records F."""

    def __init__(self, args, device: str):
        from esync.emulation.schedules import parse_speed_schedule
        self.base = args.slowdown
        self.sleeps = getattr(args, "emulation", "sleep") == "sleep"
        schedule = getattr(args, "speed_schedule", None)
        self.changes = parse_speed_schedule(schedule).get(device, []) if schedule else []

    def factor(self, elapsed: float) -> float:
        from esync.emulation.schedules import factor_in_force
        return factor_in_force(self.changes, elapsed, initial=self.base)

    def sleep_factor(self, elapsed: float) -> float:
        """The factor this process must emulate by waiting (1 when a CPU cap does it)."""
        return self.factor(elapsed) if self.sleeps else 1.0


class TrainingLoop:
    def __init__(self, worker, algo, stream, writer, store, folder, device, args, shard=None):
        self.shard = worker.rank if shard is None else shard
        self.w, self.algo, self.stream, self.writer, self.store = worker, algo, stream, writer, store
        self.args = args
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.criteria = StopCriteria(self.args)
        self.evaluations = EvaluationLog(runlayout.evaluations_file(folder))
        self.prefix = f"[rank {worker.rank} {device}]"
        self.standalone = worker.channel is None
        self.scores_inline = args.inline_eval and worker.rank == 0
        # A worker writes checkpoints at its own round ends: in round modes every rank's come
        # together, in async ones a slow rank 0's would come once per slow iteration
        self.writes_checkpoints = (worker.rank == 0 if args.writes_checkpoints is None
                                   else args.writes_checkpoints)
        if self.scores_inline:
            self.test_set = dataset.load_fashion_mnist(self.args.data_dir, "test")
            self.scores = ScoreReport(self.args, prefix=self.prefix)
            self.scoring_net = None        # a copy of the shared model, where it differs
        self.last_eval = None          # (training seconds when scored, seconds the scoring took)
        self.due = (0.0, 0)            # (training seconds, round) of the last round due, -e Ns
        self.scalars = (TrainingScalars(self.args.tensorboard)
                        if self.args.tensorboard and worker.rank == 0 else None)
        self.diverged = False          # said once that the loss is no longer a number
        self.device = device
        self.speed = DeviceSpeed(args, device)
        self.announced = None              # the slow-down factor the dashboard was last told
        self.clock0 = time.perf_counter()  # the training clock's zero (set by run)
        algo.local_iteration = self._carried_iteration
        self.carried_losses: list[float] = []   # of iterations carried into the next round
        # round logs, checkpoints, scalars: written off the training thread and its CPU cap
        self.writes = BackgroundWrites()

    def announce(self, spent: float) -> None:
        """Tell the coordinator where this worker runs and its factor at training time ``spent``
        (0, or where a resumed run goes on); ``run`` tells it again when the factor changes."""
        self.announced = self.speed.factor(spent)
        self.algo.announce(host=self.args.host_name, device=self.device, slowdown=self.announced)

    def _announce_speed(self, slowdown: float) -> None:
        """Once per change of the factor in force (compared every round): the live dashboard
        shows the new speed. The algorithm sends it without holding up the round."""
        if slowdown != self.announced:
            self.announced = slowdown
            self.algo.speed_changed(slowdown)

    def run(self, done_rounds: int, spent: float, samples: int) -> int:
        try:
            return self._train(done_rounds, spent, samples)
        except BaseException:
            # what the rounds so far logged is kept; the error in hand is the one to report
            self.writes.close(10.0, raise_failure=False)
            raise

    def _train(self, done_rounds: int, spent: float, samples: int) -> int:
        args, w = self.args, self.w
        capped = join_cpu_cap()                    # the device's speed from here on
        # CPU seconds the cap rations: where only the operator threads joined it, the threads
        # left outside (this one's Python, communication) are not counted
        operators_only = bool(capped) and capped[1] == OPERATOR_THREADS
        cpu_clock = cpu_seconds_under_cap if operators_only else time.process_time
        if capped:
            host = "; Python and communication at the host's speed" if operators_only else ""
            print(f"{self.prefix} training under the CPU cap of {capped[0]} ({capped[1]}{host})",
                  flush=True)
        # The training clock starts before the warm-up: every worker leaves the store's init
        # barrier together, so every device's clock (rank 0's, which the checkpoints and the
        # time to a target are on, included) has one zero, and a capped device's slow warm-up
        # counts as the time it is (the first round waits for it). Inline scoring is taken out.
        clock0 = time.perf_counter() - spent
        self.clock0 = clock0
        last_c = self._warm_up(capped[0] if capped else None)
        if self.announced is None:                 # nobody told: the first factor is no change
            self.announced = self.speed.factor(spent)
        wall0 = clock0                             # wall clock: everything counts
        total_samples = samples
        last_print = 0.0
        round_no = done_rounds
        sat_out = False
        carried_samples = 0         # --carry: computed during the last exchange, in this delta
        print(f"{self.prefix} training {args.network} in {args.mode} mode, "
              f"{w.num_workers} worker(s), slow-down x{args.slowdown:g}; warm-up "
              f"{last_c:.4g} s a batch", flush=True)
        while True:
            round_no += 1
            w.round_no = round_no
            record = RoundRecord(round_no, settle=w.settle)
            round_start = time.perf_counter()
            pushed0, pulled0 = w.channel.counters() if w.channel else (0, 0)
            requests0 = self.algo.state_requests()
            k, last_c, loss = self._local_phase(record, last_c)
            if self.algo.sitting_out and not sat_out:
                sat_out = True
                # What is left is the host's work (the exchange, the outer step): as on a real
                # device it runs at the host's speed, not under the device's emulated cap.
                leave_cpu_cap()
                print(f"{self.prefix} sits out from round {round_no + 1}: its iteration "
                      f"({last_c:.3g} s) is over {args.sit_out_ratio:g} times the fastest "
                      "device's (--sit-out-ratio); it pushes empty deltas from now on",
                      flush=True)
            self._warn_if_diverged(loss, round_no)
            w.round_k, w.round_c = k, last_c
            # the delta holds the round's own samples and those carried into it (its k counts both)
            own_samples = record.num_samples
            w.samples_this_round = own_samples + carried_samples
            now = time.perf_counter()
            elapsed = now - clock0
            want_stop = self.criteria.reached(round_no, elapsed, now - wall0,
                                              self._latest_accuracy())
            stop = self.algo.aggregate(record, want_stop)
            carried_samples = record.num_samples - own_samples   # what ran through the exchange
            round_samples = self.algo.global_samples
            total_samples += record.num_samples if round_samples is None else round_samples
            acc = self._evaluate_inline(record, round_no, stop, elapsed)
            if self.standalone:                       # scoring is not training time
                clock0 += record.seconds("evaluation")
            self.clock0 = clock0
            elapsed = time.perf_counter() - clock0
            if acc is not None:
                # the next score is due 9x this one's duration after the time this round logs
                self.last_eval = (elapsed, record.seconds("evaluation"))
            wall = time.perf_counter() - wall0
            pushed, pulled = w.channel.counters() if w.channel else (0, 0)
            compute = record.seconds(*COMPUTE_PHASES)
            slowdown = self.speed.factor(elapsed)
            record.extras = {
                # the latest iteration's seconds (the warm-up step's before the first): what the
                # state server knows of this device's speed, also where it computed nothing
                "k": k, "compute_time": round(compute, 6), "iteration_time": round(last_c, 6),
                "slowdown_time": round(record.seconds("emulated slowdown"), 6),
                "wait_time": round(time.perf_counter() - round_start - compute, 6),
                "bytes_pushed": pushed - pushed0, "bytes_pulled": pulled - pulled0,
                "slowdown": slowdown, "emulation": args.emulation,
                "rank": w.rank, "shard": self.shard,
                # the process's CPU seconds so far that a CPU cap rations (see cpu_clock)
                "cpu_time": round(cpu_clock(), 4),
                "state_requests": self.algo.state_requests() - requests0,
                "train_loss": round(loss, 5),
                # total_time is the training time; wall_time adds inline scoring (-m local)
                "wall_time": round(wall, 6), **self.algo.round_extras()}
            self.writes.submit(self.writer.write, record, elapsed, acc)
            self._announce_speed(slowdown)
            self._write_scalars(round_no, record, k, loss, elapsed,
                                record.num_samples if round_samples is None else round_samples)
            if stop:
                leave_cpu_cap()    # what follows is not the device's work (last checkpoint, exit)
            self._checkpoint(round_no, elapsed, total_samples, stop)
            now = time.perf_counter()
            if stop or now - last_print > 2.0:
                last_print = now
                print(f"{self.prefix} round {round_no} k={k} loss={loss:.4f} "
                      f"t={elapsed:.1f}s" + (f" acc={acc:.4f}" if acc is not None else ""),
                      flush=True)
            if stop:
                break
        self.writes.close()
        self.algo.close()
        self._close_reports()
        if w.channel is not None:
            w.channel.finish()
        print(f"{self.prefix} stopped after round {round_no} (training time {elapsed:.1f}s, "
              f"wall time {wall:.1f}s)", flush=True)
        return 0

    def _write_scalars(self, round_no: int, record: RoundRecord, k: int, loss: float,
                       elapsed: float, samples: int) -> None:
        """Rank 0's TensorBoard scalars; every worker's k where the exchange carried them."""
        if self.scalars is None:
            return
        known = self.algo.worker_ks
        worker_ks = dict(enumerate(known)) if known is not None else {self.w.rank: k}
        extras = record.extras
        self.writes.submit(self.scalars.add_round, round_no, loss=loss,
                           compute=extras["compute_time"],
                           round_seconds=extras["compute_time"] + extras["wait_time"],
                           samples=samples, elapsed=elapsed, worker_ks=worker_ks)

    def _close_reports(self) -> None:
        if self.scalars is not None:
            self.scalars.close()
        if self.scores_inline:
            self.scores.close()

    def _warn_if_diverged(self, loss: float, round_no: int) -> None:
        """Say once, on stderr, when the training loss stops being a number: the run goes on
        to its budget (its scores say how bad it is), but the cause is named now."""
        if self.diverged or math.isfinite(loss):
            return
        self.diverged = True
        flag, rate = (("-ll", self.args.local_lr) if self.args.mode == "esync"
                      else ("-l", self.args.learning_rate))
        print(f"{self.prefix} training diverged: the loss is {loss} in round {round_no} (logged "
              f"as null); lower the learning rate ({flag}, now {rate:g})",
              file=sys.stderr, flush=True)

    def _latest_accuracy(self):
        """Where the stop is voted on together, rank 0's view is enough: the others skip the read."""
        if self.algo.collective_stop and self.w.rank != 0:
            return None
        return self.evaluations.poll()

    def _warm_up(self, cap_group: str | None) -> float:
        """One step on a dummy batch: compiles the graph, gives the first c_i, uses no data.

        Where devices may sit out (ESync's ``--sit-out-ratio``) the step is a timing probe on
        an eighth of a batch, its duration scaled to a whole one: the first round ends only
        when every device has sent its first question, which carries this c, so a device 150
        times slower then holds it up for an eighth of its iteration instead of a whole one
        (and, judged too slow, never computes one). The first iteration compiles the graph
        for the whole batch. Under an emulating CPU cap (``cap_group``) the step is timed by
        its CPU seconds at the cap's steady rate (``speeds.cap_seconds``): its wall time would
        read a short probe's burst or its rounding to whole CFS periods, not the device's speed.

        The training-mode forward pass would move batch-norm running statistics towards the
        dummy batch's, so they are put back afterwards.
        """
        batch = self.args.batch_size
        may_sit_out = self.args.mode == "esync" and esync_parts.sit_out_ratio(self.args) > 0
        probe = max(1, batch // esync_parts.PROBE_DIVISOR) if may_sit_out else batch
        size = models.input_size(self.args.network)
        data_ = mx.nd.zeros((probe, 1, size, size), ctx=self.w.ctx)
        label = mx.nd.zeros((probe,), ctx=self.w.ctx)
        saved = [p.data().copy() for p in self.w.aux]
        cores = cap_cores(cap_group) if cap_group else None
        start, cpu0 = time.perf_counter(), capped_cpu_seconds(cap_group) if cores else 0.0
        with autograd.record():
            loss = self.loss_fn(self.w.net(data_), label)
        loss.backward()
        mx.nd.waitall()
        if cores:
            seconds = cap_seconds(capped_cpu_seconds(cap_group) - cpu0, cores)
        else:
            seconds = (time.perf_counter() - start) * self.speed.sleep_factor(0.0)
        for p, value in zip(self.w.aux, saved):
            p.set_data(value)
        return seconds * batch / probe

    def _local_phase(self, record: RoundRecord, last_c: float):
        """The round's own iterations; returns (their count, the last one's duration, the mean
        loss over the iterations in the round's delta: its own and those carried into it)."""
        k, loss_sum = 0, sum(self.carried_losses)
        losses = len(self.carried_losses)
        self.carried_losses = []
        while True:
            record.begin_iteration()
            if not self.algo.continue_local(k, last_c, record):
                record.drop_empty_iteration()
                break
            loss, last_c = self._iteration(record)
            loss_sum += loss
            k += 1
        return k, last_c, loss_sum / max(k + losses, 1)

    def _carried_iteration(self, record: RoundRecord) -> float:
        """One local iteration outside the round's local phase (ESync's ``--carry`` runs them
        while its exchange is in flight); logged in ``record``, returns its duration. Its loss
        counts in the next round's, whose delta it is part of."""
        record.begin_iteration()
        loss, seconds = self._iteration(record)
        self.carried_losses.append(loss)
        return seconds

    def _iteration(self, record: RoundRecord) -> tuple[float, float]:
        """One local iteration: batch, forward and backward, the algorithm's step, the emulated
        slow-down; returns (its mean loss, its duration in seconds)."""
        start = time.perf_counter()
        with record.phase("get_batch"):
            x, y = self.stream.next_batch()
        with record.phase("forward and backward"):
            with autograd.record():
                loss = self.loss_fn(self.w.net(x), y)
            # queued with the device's work, so reading it below waits for nothing: read after
            # a throttled device's quota ran out, it waited for the next CFS period (a x8
            # device: up to 16 ms an iteration, outside its computing)
            mean_loss = loss.mean()
            loss.backward()
            # MXNet runs the backward pass asynchronously: without this wait the round's
            # last backward would run inside the exchange, uncounted in c_i (a slow device
            # with k = 1 would report its forward pass alone, and the state server would
            # size every round too short for it).
            for param in self.w.trainable:
                param.grad().wait_to_read()
            mean_loss.wait_to_read()
        self.w.batch_samples = int(y.shape[0])
        self.algo.local_step(record)
        factor = self.speed.sleep_factor(time.perf_counter() - self.clock0)
        if factor > 1:
            busy = record.current()
            work = busy.get("forward and backward", 0.0) + busy.get("local update", 0.0)
            with record.phase("emulated slowdown"):
                time.sleep((factor - 1) * work)
        record.num_samples += int(y.shape[0])
        return float(mean_loss.asscalar()), time.perf_counter() - start

    def _evaluation_due(self, round_no: int, stop: bool, elapsed: float) -> bool:
        if stop:
            return True
        if self.args.eval_duration != "auto":
            return self._checkpoint_due(round_no, elapsed)
        if self.last_eval is None:
            return True               # the first round: where the accuracy curve starts
        scored_at, took = self.last_eval
        return elapsed - scored_at >= AUTO_EVAL_TRAIN_PER_EVAL * took

    def _evaluate_inline(self, record, round_no: int, stop: bool, elapsed: float):
        """Rank 0 scores the shared model on the test set when due (``--inline-eval``; the cost
        is in the module docstring) and prints the original's line. The score goes into this
        round's log and rank 0's stop vote; in -m local, which has no evaluator, also into
        ``evaluations.jsonl``, the file an evaluator would write."""
        if not self.scores_inline or not self._evaluation_due(round_no, stop, elapsed):
            return None
        images, labels = self.test_set
        with record.phase("evaluation"):
            acc = accuracy(self._shared_net(), images, labels, self.w.ctx,
                           models.input_size(self.args.network))
        print(f"[Iteration {round_no}] Test Acc {acc:.3f}", flush=True)
        if self.standalone:
            self.evaluations.append({"round": round_no, "total_time": round(elapsed, 6),
                                     "accuracy": round(acc, 5),
                                     "samples": round_no * self.args.batch_size})
        self.evaluations.latest_accuracy = acc
        self.writes.submit(self.scores.add, round_no, training_seconds=elapsed, accuracy=acc)
        return acc

    def _shared_net(self):
        """The model every rank shares, as a checkpoint holds it: this worker's network, or
        (where ESync's --overlap or --carry trains it beyond the shared model) a copy of it."""
        if not self.algo.global_model():
            return self.w.net
        if self.scoring_net is None:
            self.scoring_net = models.build(self.args.network, self.w.ctx, seed=self.args.seed)
        load_into(self.scoring_net, self._shared_arrays())
        return self.scoring_net

    def _shared_arrays(self) -> dict:
        """``{parameter name: NDArray}`` of the shared model (``Algorithm.global_model``)."""
        shared = self.algo.global_model()
        return {name: shared.get(id(p), p.data())
                for name, p in models.named_parameters(self.w.net).items()}

    def _checkpoint_due(self, round_no: int, elapsed: float) -> bool:
        """-e N: every N rounds; -e Ns (a float): the first round ending N seconds of training
        or more after the last one due (rounds of any length give one grid in time)."""
        every = self.args.eval_duration
        if isinstance(every, int):
            return round_no % every == 0
        if round_no == self.due[1]:
            return True                    # asked again about the same round
        if elapsed - self.due[0] < every:
            return False
        self.due = (elapsed, round_no)
        return True

    def _checkpoint(self, round_no: int, elapsed: float, samples: int, stop: bool) -> None:
        if self.store is None or not self.writes_checkpoints:
            return
        if self._checkpoint_due(round_no, elapsed) or stop:
            arrays = {name: array.asnumpy() for name, array in self._shared_arrays().items()}
            self.writes.submit(self.store.save, round_no, arrays, {
                "network": self.args.network, "mode": self.args.mode,
                "total_time": round(elapsed, 6), "samples": samples,
                "config": _jsonable(vars(self.args))},
                state=self.algo.saved_state())
        if stop:
            self.writes.submit(self.store.mark_done, {"round": round_no, "total_time": elapsed})


SECRET_KEYS = {"state_token"}     # never written to logs, configs or checkpoints


def _jsonable(d: dict) -> dict:
    return {k: v for k, v in d.items()
            if isinstance(v, (str, int, float, bool, type(None))) and k not in SECRET_KEYS}


def _write_json(path: Path, content: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(_jsonable(content), indent=1))


def _write_run_config(folder: Path, args, num_workers: int) -> None:
    """run.json: the run's flags, and where each value came from (``--explain``'s record;
    a launcher replaces it with its own when the job ends)."""
    content = _jsonable(dict(vars(args), num_workers=num_workers, mode_dir=folder.name))
    resolution = getattr(args, "resolution", None)
    if resolution is not None:
        content["resolved"] = resolution.record()
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / "run.json", json.dumps(content, indent=1))
