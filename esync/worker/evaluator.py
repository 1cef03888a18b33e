"""The evaluator role: scores checkpoints on the test set, off the workers' critical path.

Run beside a job (the launcher does it for you):

    DMLC_ROLE=evaluator python main.py -m sync -n lenet -ld logs

It watches ``<log_dir>/<network>/<mode_dir>/checkpoints/`` and scores **every** checkpoint,
appending one JSON line each to ``<mode_dir>/evaluations.jsonl``:
``{"round", "total_time", "accuracy", "samples"}``. Time to a target accuracy is read from these
lines, so none may be skipped. While training runs and the evaluator keeps up, it scores in
round order; when it falls behind, it scores the newest checkpoint first (rank 0's stop vote on
``--target-accuracy`` needs a current accuracy) and the ones it passed over later, after training
has ended if need be. It stops when the job's rank 0 has marked the folder done and every
checkpoint is scored. Lines may therefore be out of round order; readers sort them. Each score
also goes to TensorBoard and the state server's dashboard (``esync.worker.score_report``).
"""
import json
import time
from pathlib import Path

import mxnet as mx
import numpy as np

from esync.common import dataset, runlayout
from esync.common.checkpoint import CheckpointError, CheckpointStore
from esync.common.errors import UsageError
from esync.common.runlayout import EvaluationLog
from esync.worker import data, models
from esync.worker.score_report import ScoreReport


def accuracy(net, images: np.ndarray, labels: np.ndarray, ctx: mx.Context, input_size: int,
             batch_size: int = 1000) -> float:
    correct = 0
    for x, y in data.iterate_batches(images, labels, batch_size, input_size, ctx):
        correct += int((net(x).argmax(axis=1) == y).sum().asscalar())
    return correct / len(labels)


def load_into(net, arrays: dict) -> None:
    for name, param in models.named_parameters(net).items():
        param.set_data(mx.nd.array(arrays[name], ctx=param.list_ctx()[0]))


def evaluation_context(args) -> mx.Context:
    """Where checkpoints are scored: the CPU with ``-c 1``, else GPU ``-g`` (the launcher gives
    the evaluator a GPU no worker uses, seen as GPU 0), checked to exist here."""
    if args.cpu:
        return mx.cpu()
    visible = mx.context.num_gpus()
    if args.gpu >= visible:
        raise UsageError(f"the evaluator: -c 0 -g {args.gpu} scores on GPU {args.gpu}, but "
                         f"MXNet sees {visible} GPU(s) here (a CPU wheel, or "
                         "CUDA_VISIBLE_DEVICES); score on the CPU with -c 1")
    return mx.gpu(args.gpu)


def run(args, mode_dir: Path, *, poll_seconds: float = 0.2, idle_timeout: float = 0.0) -> int:
    report = ScoreReport(args)
    try:
        return _score_checkpoints(args, mode_dir, report, poll_seconds, idle_timeout)
    finally:
        report.close()


def _score_checkpoints(args, mode_dir: Path, report: ScoreReport, poll_seconds: float,
                       idle_timeout: float) -> int:
    ctx = evaluation_context(args)
    images, labels = dataset.load_fashion_mnist(args.data_dir, "test")
    net = models.build(args.network, ctx, seed=args.seed)
    size = models.input_size(args.network)
    shapes = {k: p.shape for k, p in models.named_parameters(net).items()}
    store = CheckpointStore(runlayout.checkpoints_dir(mode_dir))
    log = EvaluationLog(runlayout.evaluations_file(mode_dir))
    scored = {json.loads(line)["round"] for line in log.lines()}
    idle_since = time.monotonic()
    print(f"[evaluator] watching {store.folder}", flush=True)
    while True:
        done = store.is_done()
        pending = [p for p in store.list() if store.round_of(p) not in scored]
        if not pending:
            if done:
                print("[evaluator] job finished; all checkpoints scored", flush=True)
                return 0
            if idle_timeout and time.monotonic() - idle_since > idle_timeout:
                print("[evaluator] no new checkpoint for too long; stopping", flush=True)
                return 1
            time.sleep(poll_seconds)
            continue
        idle_since = time.monotonic()
        path = next_checkpoint(pending, training_ended=done)
        try:
            meta, arrays = store.load(path, network=args.network, shapes=shapes)
        except CheckpointError as exc:
            print(f"[evaluator] error: {exc}", flush=True)
            return 2
        load_into(net, arrays)
        acc = accuracy(net, images, labels, ctx, size)
        log.append({"round": meta["round"], "total_time": meta["total_time"],
                    "accuracy": round(acc, 5), "samples": meta.get("samples")})
        report.add(meta["round"], training_seconds=meta["total_time"], accuracy=acc)
        scored.add(meta["round"])
        print(f"[evaluator] round {meta['round']} t={meta['total_time']:.1f}s "
              f"accuracy {acc:.4f}", flush=True)


BEHIND = 2     # more pending checkpoints than this while training: score the newest first


def next_checkpoint(pending: list[Path], *, training_ended: bool) -> Path:
    """Which pending checkpoint (in round order) to score now; the others stay pending.

    In order while keeping up or once training has ended; the newest first while behind.
    """
    return pending[-1] if len(pending) > BEHIND and not training_ended else pending[0]
