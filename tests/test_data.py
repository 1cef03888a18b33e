"""Tests of esync.common.dataset and esync.worker.data on real IDX files written to tmp_path."""
import gzip
import os

import mxnet as mx
import numpy as np
import pytest

from esync.common.catalog import FASHION_FILES
from esync.common.dataset import (DataError, load_fashion_mnist, partition, read_idx,
                                  training_shard, write_idx)
from esync.common.modes import CLASS_SORTED, IID
from esync.worker.data import BatchStream, iterate_batches


def _header(type_code, shape):
    return bytes([0, 0, type_code, len(shape)]) + b"".join(n.to_bytes(4, "big") for n in shape)


# IDX files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["images-idx3-ubyte.gz", "images-idx3-ubyte"])
def test_idx_round_trip_of_images(tmp_path, name):
    images = np.random.RandomState(0).randint(0, 256, size=(7, 28, 28)).astype(np.uint8)
    write_idx(tmp_path / name, images)
    got = read_idx(tmp_path / name)
    assert got.dtype == np.uint8 and np.array_equal(got, images)


@pytest.mark.parametrize("name", ["labels-idx1-ubyte.gz", "labels-idx1-ubyte"])
def test_idx_round_trip_of_labels(tmp_path, name):
    labels = np.arange(10, dtype=np.uint8)
    write_idx(tmp_path / name, labels)
    assert np.array_equal(read_idx(tmp_path / name), labels)


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip_of_wider_types(tmp_path, dtype):
    array = np.arange(24).reshape(2, 3, 4).astype(dtype)
    write_idx(tmp_path / "a.idx", array)
    got = read_idx(tmp_path / "a.idx")
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, array)


def test_plain_idx_has_the_standard_image_magic(tmp_path):
    write_idx(tmp_path / "x", np.zeros((2, 28, 28), np.uint8))
    assert (tmp_path / "x").read_bytes()[:16] == _header(0x08, (2, 28, 28))


def test_gz_idx_is_byte_identical_across_writes(tmp_path):
    labels = np.arange(100, dtype=np.uint8) % 10
    write_idx(tmp_path / "a.gz", labels)
    write_idx(tmp_path / "b.gz", labels)
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()


def test_write_idx_leaves_only_the_target_file(tmp_path):
    write_idx(tmp_path / "labels.gz", np.zeros(5, np.uint8))
    assert os.listdir(tmp_path) == ["labels.gz"]


def test_write_idx_rejects_int64(tmp_path):
    with pytest.raises(ValueError, match="IDX type"):
        write_idx(tmp_path / "x", np.zeros(3, np.int64))


def test_read_idx_reports_a_truncated_plain_file(tmp_path):
    path = tmp_path / "images"
    path.write_bytes(_header(0x08, (3, 28, 28)) + bytes(28 * 28 * 2))
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)


def test_read_idx_reports_a_truncated_payload_inside_gzip(tmp_path):
    path = tmp_path / "images.gz"
    path.write_bytes(gzip.compress(_header(0x08, (3, 28, 28)) + bytes(100)))
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)


def test_read_idx_reports_a_cut_gzip_stream(tmp_path):
    path = tmp_path / "images.gz"
    write_idx(path, np.random.RandomState(1).randint(0, 256, (50, 28, 28)).astype(np.uint8))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)


def test_read_idx_reports_a_short_header(tmp_path):
    path = tmp_path / "labels"
    path.write_bytes(_header(0x08, (3, 28, 28))[:9])
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)


def test_read_idx_reports_corrupt_gzip(tmp_path):
    path = tmp_path / "labels.gz"
    path.write_bytes(b"this is not gzip data at all")
    with pytest.raises(DataError, match="corrupt gzip"):
        read_idx(path)


def test_read_idx_reports_gzip_with_damaged_data(tmp_path):
    path = tmp_path / "images.gz"
    write_idx(path, np.random.RandomState(2).randint(0, 256, (50, 28, 28)).astype(np.uint8))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2:len(raw) // 2 + 64] = bytes(64)
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"images\.gz.*(corrupt|truncated)"):
        read_idx(path)


def test_read_idx_reports_wrong_magic(tmp_path):
    path = tmp_path / "labels"
    path.write_bytes(b"\x12\x34\x08\x01" + (3).to_bytes(4, "big") + bytes(3))
    with pytest.raises(DataError, match="magic"):
        read_idx(path)


def test_read_idx_reports_unknown_type_byte(tmp_path):
    path = tmp_path / "labels"
    path.write_bytes(b"\x00\x00\x07\x01" + (3).to_bytes(4, "big") + bytes(3))
    with pytest.raises(DataError, match="magic"):
        read_idx(path)


def test_read_idx_reports_trailing_bytes(tmp_path):
    path = tmp_path / "labels"
    path.write_bytes(_header(0x08, (3,)) + bytes(5))
    with pytest.raises(DataError, match="unexpected bytes"):
        read_idx(path)


def test_read_idx_reports_a_missing_file(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_idx(tmp_path / "nothing.gz")


# load_fashion_mnist --------------------------------------------------------------------------


def test_load_fashion_mnist_reads_both_splits(fashion_data_dir):
    images, labels = load_fashion_mnist(fashion_data_dir, "train")
    test_images, test_labels = load_fashion_mnist(fashion_data_dir, "test")
    assert images.shape == (200, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (200,) and labels.dtype == np.uint8
    assert test_images.shape == (100, 28, 28) and test_labels.shape == (100,)


def test_load_fashion_mnist_rejects_an_unknown_split(fashion_data_dir):
    with pytest.raises(ValueError, match="split"):
        load_fashion_mnist(fashion_data_dir, "validation")


def test_load_fashion_mnist_reports_a_missing_folder_and_the_fix(tmp_path):
    with pytest.raises(DataError, match=r"does not exist.*prepare_data\.py"):
        load_fashion_mnist(tmp_path / "nowhere", "train")


def test_load_fashion_mnist_reports_an_empty_folder(tmp_path):
    (tmp_path / "fashion-mnist").mkdir()
    with pytest.raises(DataError, match="is empty"):
        load_fashion_mnist(tmp_path, "train")


def test_load_fashion_mnist_reports_a_folder_without_idx_files(tmp_path):
    (tmp_path / "fashion-mnist").mkdir()
    (tmp_path / "fashion-mnist" / "README").write_text("hi")
    with pytest.raises(DataError, match="none of the IDX files"):
        load_fashion_mnist(tmp_path, "train")


def test_load_fashion_mnist_reports_a_missing_file(fashion_data_dir):
    (fashion_data_dir / "fashion-mnist" / FASHION_FILES["test"][1]).unlink()
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz is missing"):
        load_fashion_mnist(fashion_data_dir, "test")


def test_load_fashion_mnist_reports_a_count_mismatch(fashion_data_dir):
    write_idx(fashion_data_dir / "fashion-mnist" / FASHION_FILES["train"][1],
              np.zeros(150, np.uint8))
    with pytest.raises(DataError, match="200 images but .* 150 labels"):
        load_fashion_mnist(fashion_data_dir, "train")


def test_load_fashion_mnist_reports_labels_out_of_range(fashion_data_dir):
    labels = np.zeros(200, np.uint8)
    labels[3] = 12
    write_idx(fashion_data_dir / "fashion-mnist" / FASHION_FILES["train"][1], labels)
    with pytest.raises(DataError, match=r"outside 0\.\.9"):
        load_fashion_mnist(fashion_data_dir, "train")


def test_load_fashion_mnist_reports_images_of_the_wrong_size(fashion_data_dir):
    write_idx(fashion_data_dir / "fashion-mnist" / FASHION_FILES["test"][0],
              np.zeros((100, 32, 32), np.uint8))
    with pytest.raises(DataError, match=r"\(N, 28, 28\)"):
        load_fashion_mnist(fashion_data_dir, "test")


def test_load_fashion_mnist_names_the_fix_for_a_corrupt_file(fashion_data_dir):
    (fashion_data_dir / "fashion-mnist" / FASHION_FILES["train"][0]).write_bytes(b"junk")
    with pytest.raises(DataError, match=r"corrupt gzip.*prepare_data\.py"):
        load_fashion_mnist(fashion_data_dir, "train")


# partition -----------------------------------------------------------------------------------

BALANCED = np.repeat(np.arange(10, dtype=np.uint8), 100)[np.random.RandomState(3).permutation(1000)]


@pytest.mark.parametrize("by_class", [False, True])
def test_partition_shards_are_disjoint_and_complete_up_to_the_remainder(by_class):
    labels = BALANCED[:999]
    shards = [partition(labels, 4, p, by_class=by_class) for p in range(4)]
    joined = np.concatenate(shards)
    assert all(len(s) == 249 for s in shards)
    assert len(np.unique(joined)) == len(joined) == 996
    assert joined.min() >= 0 and joined.max() < 999


def test_partition_is_reproducible_with_the_same_seed():
    assert np.array_equal(partition(BALANCED, 3, 1, seed=7), partition(BALANCED, 3, 1, seed=7))


def test_partition_differs_with_another_seed():
    assert not np.array_equal(partition(BALANCED, 3, 1, seed=7), partition(BALANCED, 3, 1, seed=8))


def test_partition_iid_shard_holds_every_class():
    assert set(BALANCED[partition(BALANCED, 4, 2)]) == set(range(10))


def test_partition_by_class_gives_worker_0_of_2_classes_0_to_4():
    assert set(BALANCED[partition(BALANCED, 2, 0, by_class=True)]) == {0, 1, 2, 3, 4}
    assert set(BALANCED[partition(BALANCED, 2, 1, by_class=True)]) == {5, 6, 7, 8, 9}


def test_partition_by_class_blocks_are_class_contiguous():
    tops = [BALANCED[partition(BALANCED, 5, p, by_class=True)] for p in range(5)]
    assert [sorted(set(t)) for t in tops] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


@pytest.mark.parametrize("num_parts, part", [(0, 0), (2, 2), (2, -1), (2.0, 0), (True, 0),
                                             (1001, 0)])
def test_partition_rejects_bad_arguments(num_parts, part):
    with pytest.raises(ValueError):
        partition(BALANCED, num_parts, part)


def test_partition_rejects_labels_that_are_not_1d():
    with pytest.raises(ValueError, match="one-dimensional"):
        partition(BALANCED.reshape(10, 100), 2, 0)


# BatchStream ---------------------------------------------------------------------------------


def _indexed_set(n):
    """Image i has every pixel equal to i % 251 and label i % 10: a batch shows what it holds."""
    ids = np.arange(n)
    images = np.broadcast_to((ids % 251).astype(np.uint8)[:, None, None], (n, 28, 28)).copy()
    return images, (ids % 10).astype(np.uint8)


def _ids(data):
    return np.rint(data.asnumpy()[:, 0, 0, 0] * 255).astype(int)


def test_batch_stream_gives_float32_batches_in_0_1():
    images, labels = _indexed_set(100)
    images[0] = 255
    data, label = BatchStream(images, labels, 16, shuffle=False).next_batch()
    assert isinstance(data, mx.nd.NDArray) and data.shape == (16, 1, 28, 28)
    assert data.dtype == np.float32 and label.dtype == np.float32 and label.shape == (16,)
    values = data.asnumpy()
    assert values.min() >= 0.0 and values.max() == pytest.approx(1.0)


def test_batch_stream_labels_match_their_images():
    images, labels = _indexed_set(200)
    stream = BatchStream(images, labels, 32, seed=4)
    for _ in range(10):
        data, label = stream.next_batch()
        assert np.array_equal(_ids(data) % 10, label.asnumpy().astype(int))


def test_batch_stream_epoch_visits_each_sample_once():
    images, labels = _indexed_set(64)
    stream = BatchStream(images, labels, 16, seed=5)
    seen = np.concatenate([_ids(stream.next_batch()[0]) for _ in range(4)])
    assert sorted(seen) == list(range(64))


def test_batch_stream_reshuffles_every_epoch():
    images, labels = _indexed_set(64)
    stream = BatchStream(images, labels, 64, seed=6)
    first, second = _ids(stream.next_batch()[0]), _ids(stream.next_batch()[0])
    assert sorted(first) == sorted(second) and not np.array_equal(first, second)


def test_batch_stream_is_reproducible_from_its_seed():
    images, labels = _indexed_set(100)
    a, b = BatchStream(images, labels, 10, seed=9), BatchStream(images, labels, 10, seed=9)
    for _ in range(15):
        assert np.array_equal(_ids(a.next_batch()[0]), _ids(b.next_batch()[0]))


def test_batch_stream_counts_epochs_and_samples():
    images, labels = _indexed_set(50)
    stream = BatchStream(images, labels, 16)
    assert stream.batches_per_epoch == 3
    for _ in range(3):
        stream.next_batch()
    assert (stream.epoch, stream.samples_seen) == (0, 48)
    stream.next_batch()
    assert (stream.epoch, stream.samples_seen) == (1, 64)


def test_batch_stream_without_shuffle_goes_in_order():
    images, labels = _indexed_set(40)
    stream = BatchStream(images, labels, 20, shuffle=False)
    assert list(_ids(stream.next_batch()[0])) == list(range(20))
    assert list(_ids(stream.next_batch()[0])) == list(range(20, 40))
    assert list(_ids(stream.next_batch()[0])) == list(range(20))


def test_batch_stream_keep_last_ends_each_pass_with_the_partial_batch():
    images, labels = _indexed_set(50)
    stream = BatchStream(images, labels, 16, shuffle=False, keep_last=True)
    assert stream.batches_per_epoch == 4
    sizes = [len(_ids(stream.next_batch()[0])) for _ in range(4)]
    assert sizes == [16, 16, 16, 2] and (stream.epoch, stream.samples_seen) == (0, 50)
    assert list(_ids(stream.next_batch()[0])) == list(range(16))
    assert (stream.epoch, stream.samples_seen) == (1, 66)


def test_class_sorted_stream_feeds_every_sample_of_the_shard_once_per_epoch():
    """-s 1 as the trainer builds it: two passes each give the whole shard, in class order,
    the last (partial) batch included."""
    images, labels = _indexed_set(1000)
    index, reshuffle = training_shard(labels, 3, 1, CLASS_SORTED)
    assert not reshuffle and len(index) % 64 != 0        # 333 samples: a partial last batch
    stream = BatchStream(images[index], labels[index], 64, shuffle=reshuffle,
                         keep_last=not reshuffle)
    for epoch in range(2):
        fed = []
        while len(fed) < len(index):
            data, label = stream.next_batch()
            assert stream.epoch == epoch
            fed.extend(_ids(data))
        assert fed == list(images[index][:, 0, 0])       # each once, in the shard's order
        assert stream.samples_seen == (epoch + 1) * len(index)
    assert len(_ids(stream.next_batch()[0])) == 64 and stream.epoch == 2


def test_shuffled_streams_still_drop_the_partial_batch():
    images, labels = _indexed_set(1000)
    _, reshuffle = training_shard(labels, 3, 1, IID)
    assert reshuffle
    stream = BatchStream(images[:333], labels[:333], 64, shuffle=reshuffle,
                         keep_last=not reshuffle)
    assert stream.batches_per_epoch == 5
    assert all(len(_ids(stream.next_batch()[0])) == 64 for _ in range(6))
    assert stream.epoch == 1


@pytest.mark.parametrize("size", [32, 224])
def test_batch_stream_resizes_to_the_input_size(size):
    images, labels = _indexed_set(20)
    data, _ = BatchStream(images, labels, 4, input_size=size).next_batch()
    assert data.shape == (4, 1, size, size)
    values = data.asnumpy()
    # constant images stay constant under bilinear resizing
    assert np.allclose(values, values[:, :, :1, :1], atol=1e-5)


def test_batch_stream_rejects_a_shard_smaller_than_one_batch():
    images, labels = _indexed_set(10)
    with pytest.raises(ValueError, match="fewer than one batch"):
        BatchStream(images, labels, 64)


@pytest.mark.parametrize("batch_size", [0, -3, 2.5])
def test_batch_stream_rejects_a_bad_batch_size(batch_size):
    images, labels = _indexed_set(10)
    with pytest.raises(ValueError, match="batch_size"):
        BatchStream(images, labels, batch_size)


def test_batch_stream_rejects_mismatched_labels():
    images, labels = _indexed_set(10)
    with pytest.raises(ValueError, match="labels"):
        BatchStream(images, labels[:9], 2)


# iterate_batches -----------------------------------------------------------------------------


def test_iterate_batches_covers_every_sample_once_in_order():
    images, labels = _indexed_set(50)
    batches = list(iterate_batches(images, labels, 16))
    assert [b[0].shape[0] for b in batches] == [16, 16, 16, 2]
    assert list(np.concatenate([_ids(d) for d, _ in batches])) == list(range(50))
    assert list(np.concatenate([lab.asnumpy() for _, lab in batches])) == list(labels)


def test_iterate_batches_resizes_to_the_input_size():
    images, labels = _indexed_set(5)
    data, label = next(iterate_batches(images, labels, 8, input_size=32))
    assert data.shape == (5, 1, 32, 32) and label.dtype == np.float32
