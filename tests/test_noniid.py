"""-s: how the training set reaches each worker (i.i.d., the original's class order, shuffled)."""
import numpy as np
import pytest

from esync import cli
from esync.worker import trainer
from esync.worker.algorithms import mode_dir_name
from esync.common.dataset import load_fashion_mnist

WORKERS, BATCH = 2, 8


def _batch_classes(data_dir, split, rank, batches=10):
    """Labels of the first `batches` batches worker `rank` trains on, through the trainer."""
    args = cli.parse_args(["-m", "local", "-c", "1", "-n", "lenet", "-b", str(BATCH),
                           "-dd", str(data_dir), "-s", str(split)])
    stream = trainer._shard(args, rank, WORKERS)
    return [sorted(set(stream.next_batch()[1].asnumpy().astype(int).tolist()))
            for _ in range(batches)]


def test_s1_feeds_each_shard_in_class_order_like_the_original(fashion_data_dir):
    # 20 samples per class, worker 0 holds classes 0-4, batches of 8 walk them in order
    assert _batch_classes(fashion_data_dir, 1, rank=0, batches=12) == [
        [0], [0], [0, 1], [1], [1], [2], [2], [2, 3], [3], [3], [4], [4]]


def test_s1_batches_hold_at_most_two_classes_in_ascending_order(fashion_data_dir):
    classes = _batch_classes(fashion_data_dir, 1, rank=1, batches=12)
    assert all(len(batch) <= 2 for batch in classes) and classes == sorted(classes)


def test_s2_reshuffles_the_same_class_block_inside_the_shard(fashion_data_dir):
    classes = _batch_classes(fashion_data_dir, 2, rank=0, batches=12)
    seen = set().union(*map(set, classes))
    assert seen <= {0, 1, 2, 3, 4} and np.mean([len(batch) for batch in classes]) > 3


def test_s1_and_s2_shards_hold_the_same_samples(fashion_data_dir):
    from esync.common.dataset import training_shard
    _, labels = load_fashion_mnist(fashion_data_dir, "train")
    ordered, _ = training_shard(labels, WORKERS, 1, 1)
    shuffled, _ = training_shard(labels, WORKERS, 1, 2)
    assert sorted(ordered) == sorted(shuffled)


def test_s2_logs_to_its_own_folder_apart_from_the_originals_niid():
    assert [mode_dir_name("esync", 0, s) for s in (0, 1, 2)] \
        == ["esync", "esync-niid", "esync-niid-shuffled"]


def test_s_rejects_an_unknown_split_in_one_line():
    with pytest.raises(cli.UsageError, match=r"-s/--split-by-class: must be 0, 1, 2, got 3"):
        cli.parse_args(["-s", "3"])


@pytest.mark.parametrize("split,mode_dir", [(1, "esync-niid"), (2, "esync-niid-shuffled")])
def test_by_class_cluster_pins_devices_to_class_shards_and_learns(tmp_path, fashion_dir_factory,
                                                                  split, mode_dir):
    """A real 2-worker ESync cluster on by-class data: cluster.json maps each device to its
    shard and that shard's classes (worker i, shard i: classes 0-4, then 5-9), each worker's
    round logs name the same shard, and the model learns well above chance (0.1). Without outer
    momentum: with the launcher's Nesterov 0.9 this -s 1 cluster ends at chance (issue 21)."""
    import json
    from support import device_logs, run_cluster
    data_dir = fashion_dir_factory(train_per_class=100, test_per_class=30)
    run_cluster(tmp_path, data_dir, "-m", "esync", "-s", split, "--workers", 2,
                "--slowdown", "1,2", "--aggregation", "fednova", "--outer-momentum", 0,
                "--no-nesterov", "-gl", 1, "-ll", 0.05 / 32, "-b", 32,
                "--max-rounds", 40, "-e", 40, "--max-seconds", 0)
    folder = tmp_path / "lenet" / mode_dir
    placement = json.loads((folder / "cluster.json").read_text())["placement"]
    assert [(p["device"], p["shard"], p["classes"]) for p in placement] == [
        ("cpu0", 0, [0, 1, 2, 3, 4]), ("cpu1", 1, [5, 6, 7, 8, 9])]
    logs = device_logs(folder)
    assert {device: {r["shard"] for r in rounds} for device, rounds in logs.items()} == {
        "cpu0": {0}, "cpu1": {1}}
    final = json.loads((folder / "evaluations.jsonl").read_text().splitlines()[-1])["accuracy"]
    assert final > 0.3, final


def test_divergence_is_named_in_a_cluster(tmp_path, fashion_dir_factory):
    """A learning rate far too large: the worker says so on stderr (the launcher keeps its log),
    naming the flag to lower, and the round logs hold null losses, not a crash."""
    from support import device_logs, run_cluster
    data_dir = fashion_dir_factory(train_per_class=20, test_per_class=10)
    run_cluster(tmp_path, data_dir, "-m", "sync", "--workers", 2, "--slowdown", "1",
                "-l", 1e6, "-b", 16, "--max-rounds", 8, "-e", 8, "--max-seconds", 0,
                "--no-evaluator")
    folder = tmp_path / "lenet" / "sync"
    log = (folder / "processes" / "worker-cpu0.log").read_text()
    assert "training diverged" in log and "lower the learning rate (-l, now 1e+06)" in log, log
    assert any(r["train_loss"] is None for r in device_logs(folder)["cpu0"])
