"""Real ps-lite clusters on loopback: aggregation is exact, every mode trains and stops cleanly."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from support import device_logs, processes_mentioning, run_cluster, write_fashion_dir
from esync import data, models
from esync.checkpoint import CheckpointStore

LR, BATCH, STEPS, SEED = 0.0125, 8, 3, 1     # LR x the batch-summed gradient (0.1 on the mean)


def reference_sgd(data_dir, workers=2, steps=STEPS):
    """Single-process SGD on the union of the workers' batches, in their order: the SSGD truth."""
    images, labels = data.load_fashion_mnist(data_dir, "train")
    streams = []
    for rank in range(workers):
        index = data.partition(labels, workers, rank, seed=SEED)
        streams.append(data.BatchStream(images[index], labels[index], BATCH, 28, mx.cpu(),
                                        seed=SEED * 1000 + rank))
    net = models.build("lenet", mx.cpu(), seed=SEED)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR}, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        batches = [s.next_batch() for s in streams]
        x = mx.nd.concat(*[b[0] for b in batches], dim=0)
        y = mx.nd.concat(*[b[1] for b in batches], dim=0)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(workers)          # the original: w - lr * (sum of batch sums) / N
    return {k: p.data().asnumpy() for k, p in models.named_parameters(net).items()}


def untrained_accuracy(data_dir):
    from esync.evaluator import accuracy
    images, labels = data.load_fashion_mnist(data_dir, "test")
    return accuracy(models.build("lenet", mx.cpu(), seed=SEED), images, labels, mx.cpu(), 28)


def scores(mode_dir):
    lines = (mode_dir / "evaluations.jsonl").read_text().splitlines()
    return [json.loads(line)["accuracy"] for line in lines]


def final_checkpoint(mode_dir, steps=STEPS):
    store = CheckpointStore(mode_dir / "checkpoints")
    meta, arrays = store.load(store.path_for(steps), network="lenet")
    return arrays


def assert_same_model(got, want):
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return write_fashion_dir(tmp_path_factory.mktemp("data"), train_per_class=40,
                             test_per_class=20)


def test_two_worker_sync_equals_single_process_sgd(tmp_path, small_data):
    run_cluster(tmp_path, small_data, "-m", "sync", "--workers", 2, "--slowdown", "1",
                "-l", LR, "-b", BATCH, "--max-rounds", STEPS, "-e", 1, "--max-seconds", 0,
                "--seed", SEED, "--no-evaluator")
    assert_same_model(final_checkpoint(tmp_path / "lenet" / "sync"), reference_sgd(small_data))


def test_esync_with_one_local_step_and_unit_global_lr_equals_ssgd(tmp_path, small_data):
    run_cluster(tmp_path, small_data, "-m", "esync", "--local-iters", 1, "-gl", 1,
                "--workers", 2, "--slowdown", "1", "-ll", LR, "-b", BATCH,
                "--max-rounds", STEPS, "-e", 1, "--max-seconds", 0, "--seed", SEED,
                "--no-evaluator")
    assert_same_model(final_checkpoint(tmp_path / "lenet" / "esync"), reference_sgd(small_data))


def test_sync_workers_start_from_rank_zero_model_and_log_every_iteration(tmp_path, small_data):
    run_cluster(tmp_path, small_data, "-m", "sync", "--workers", 2, "--slowdown", "1,2",
                "--max-rounds", 5, "-e", 5, "--max-seconds", 0, "--no-evaluator")
    logs = device_logs(tmp_path / "lenet" / "sync")
    assert sorted(logs) == ["cpu0", "cpu1"]
    for rounds in logs.values():
        assert [r["num_iters"] for r in rounds] == [1, 2, 3, 4, 5]
        assert all("global aggregate" in r["time"]["0"] for r in rounds)
        assert all(r["bytes_pushed"] > 0 and r["bytes_pulled"] == r["bytes_pushed"]
                   for r in rounds)
    assert {rounds[0]["slowdown"] for rounds in logs.values()} == {1.0, 2.0}


@pytest.mark.parametrize("extra", [["-m", "async"], ["-m", "async", "-dcasgd", 1]],
                         ids=["async", "dcasgd"])
def test_async_modes_train_and_stop_cleanly(tmp_path, fashion_dir_factory, extra):
    data_dir = fashion_dir_factory(train_per_class=100, test_per_class=30)
    run_cluster(tmp_path, data_dir, *extra, "--workers", 2, "--slowdown", "1,2", "-l", 0.05 / 16,
                "-b", 16, "--max-rounds", 60, "-e", 10, "--max-seconds", 0)
    mode_dir = next((tmp_path / "lenet").iterdir())
    assert untrained_accuracy(data_dir) < 0.3 < 0.8 < scores(mode_dir)[-1]
    assert processes_mentioning(str(tmp_path)) == []


def test_esync_fast_worker_runs_about_four_local_steps_per_slow_one(tmp_path,
                                                                    fashion_dir_factory):
    data_dir = fashion_dir_factory(train_per_class=100, test_per_class=30)
    run_cluster(tmp_path, data_dir, "-m", "esync", "--workers", 2, "--slowdown", "1,4",
                "-ll", 0.05 / 32, "-b", 32, "--max-rounds", 20, "-e", 5, "--max-seconds", 0)
    mode_dir = tmp_path / "lenet" / "esync"
    logs = device_logs(mode_dir)
    fast = [r["k"] for r in logs["cpu0"][2:]]            # the first rounds calibrate c
    slow = [r["k"] for r in logs["cpu1"]]
    assert set(slow) == {1}
    assert 3 <= np.median(fast) <= 5, fast
    assert untrained_accuracy(data_dir) < 0.3 < 0.8 < scores(mode_dir)[-1]
    assert processes_mentioning(str(tmp_path)) == []


def test_planned_policy_makes_two_requests_per_worker_per_round(tmp_path, small_data):
    run_cluster(tmp_path, small_data, "-m", "esync", "--policy", "planned", "--workers", 2,
                "--slowdown", "1,3", "-b", 16, "--max-rounds", 8, "-e", 8, "--max-seconds", 0,
                "--no-evaluator")
    logs = device_logs(tmp_path / "lenet" / "esync")
    for rounds in logs.values():
        assert [r["state_requests"] for r in rounds] == [2] * 8   # plan + reset
    assert max(r["k"] for r in logs["cpu0"][2:]) >= 2


def test_state_token_is_never_written_to_disk(tmp_path, small_data):
    token = "do-not-write-me-7f3a9c"
    run_cluster(tmp_path, small_data, "-m", "esync", "--workers", 2, "-b", 16,
                "--max-rounds", 3, "-e", 3, "--max-seconds", 0, env={"ESYNC_STATE_TOKEN": token})
    written = [p for p in tmp_path.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert written == []


def test_batch_norm_network_trains_through_the_parameter_server(tmp_path, small_data):
    run_cluster(tmp_path, small_data, "-m", "esync", "--local-iters", 2, "-n", "resnet18-v1",
                "--workers", 2, "-b", 4, "-ll", 0.01 / 4, "--max-rounds", 2, "-e", 2,
                "--max-seconds", 0, "--no-evaluator")
    store = CheckpointStore(tmp_path / "resnet18-v1" / "esync" / "checkpoints")
    _, arrays = store.load(store.path_for(2), network="resnet18-v1")
    running_means = [v for k, v in arrays.items() if k.endswith("running_mean")]
    assert running_means and any(np.abs(v).sum() > 0 for v in running_means)
