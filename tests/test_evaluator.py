"""The evaluator scores every checkpoint, also the ones it fell behind on during training."""
import json
import threading
import time

import mxnet as mx
import pytest

from support import write_fashion_dir
from esync import cli
from esync.worker import evaluator, models
from esync.common.checkpoint import CheckpointStore

ROUNDS = (10, 20, 30, 40, 50)


def wait_for(condition, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def scored_rounds(mode_dir):
    path = mode_dir / "evaluations.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["round"] for line in path.read_text().splitlines() if line]


def test_checkpoints_left_behind_during_training_are_scored_after_it(tmp_path):
    data_dir = write_fashion_dir(tmp_path / "data", train_per_class=2, test_per_class=5)
    args = cli.build_parser().parse_args(["-c", "1", "-n", "lenet", "-dd", str(data_dir),
                                          "--seed", "0"])
    mode_dir = tmp_path / "lenet" / "sync"
    store = CheckpointStore(mode_dir / "checkpoints")
    net = models.build("lenet", mx.cpu(), seed=0)
    arrays = {k: p.data().asnumpy() for k, p in models.named_parameters(net).items()}
    for r in ROUNDS:     # the evaluator starts behind: five checkpoints, training still running
        store.save(r, arrays, {"network": "lenet", "total_time": r / 10, "samples": r * 64})
    codes = []
    thread = threading.Thread(target=lambda: codes.append(
        evaluator.run(args, mode_dir, poll_seconds=0.05, idle_timeout=120)), daemon=True)
    thread.start()
    # It scored something while "training" (or died: then the assertion below says so).
    wait_for(lambda: scored_rounds(mode_dir) or not thread.is_alive())
    store.mark_done({"round": ROUNDS[-1], "total_time": 5.0})
    thread.join(timeout=180)
    assert codes == [0] and sorted(scored_rounds(mode_dir)) == list(ROUNDS)


@pytest.mark.parametrize("pending, ended, chosen", [
    (3, False, 2), (2, False, 0), (3, True, 0)])
def test_newest_first_only_while_behind_during_training(tmp_path, pending, ended, chosen):
    paths = [tmp_path / f"round-{i:08d}.npz" for i in range(pending)]
    assert evaluator.next_checkpoint(paths, training_ended=ended) == paths[chosen]


def test_a_caught_up_older_score_does_not_replace_the_newest(tmp_path):
    log = evaluator.EvaluationLog(tmp_path / "evaluations.jsonl")
    for rnd, acc in ((50, 0.9), (10, 0.3)):
        log.append({"round": rnd, "total_time": rnd / 10, "accuracy": acc})
    assert log.poll() == 0.9


def test_an_evaluator_asked_for_a_gpu_mxnet_cannot_see_says_how_to_score_on_the_cpu():
    from esync.common.errors import UsageError
    beyond = mx.context.num_gpus()              # one more than this machine has
    args = cli.build_parser().parse_args(["-c", "0", "-g", str(beyond), "-n", "lenet"])
    with pytest.raises(UsageError, match=f"MXNet sees {beyond} GPU.*score on the CPU with -c 1"):
        evaluator.evaluation_context(args)
