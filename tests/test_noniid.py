"""-s: how the training set reaches each worker (i.i.d., the original's class order, shuffled)."""
import numpy as np
import pytest

from esync import cli
from esync.worker import trainer
from esync.worker.algorithms import mode_dir_name
from esync.worker.data import load_fashion_mnist

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
    from esync.worker.data import training_shard
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
