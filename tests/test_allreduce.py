"""--collective allreduce: Horovod's ring on real processes (Gloo on loopback) gives the parameter
server's global model, and its jobs end like ps-lite ones when a worker dies."""
import importlib.util
import os
import signal

import numpy as np
import pytest

from support import device_logs, processes_of, write_fashion_dir
from esync.common.checkpoint import CheckpointStore
from test_launch import quiet, wait_for_rounds, worker_pid

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("horovod") is None,
    reason="Horovod is not installed: `bash scripts/setup.sh` builds it (it needs cmake and g++)")

ROUNDS, KS = 3, "1,3"


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return write_fashion_dir(tmp_path_factory.mktemp("data"), train_per_class=40,
                             test_per_class=20)


def _final_model(folder, mode="esync"):
    store = CheckpointStore(folder / "lenet" / mode / "checkpoints")
    _, arrays = store.load(store.path_for(ROUNDS), network="lenet")
    return arrays


@pytest.mark.parametrize("rule", [
    ["--aggregation", "mean", "--outer-momentum", 0, "--no-nesterov"],
    ["--aggregation", "weighted", "--outer-momentum", 0.9, "--nesterov", "-gl", 0.7],
    ["--aggregation", "fednova", "--outer-momentum", 0, "--no-nesterov", "--scaffold"],
    ["--aggregation", "weighted", "--outer-momentum", 0.9, "--nesterov", "-gl", 0.7,
     "--comm-dtype", "float16"],
], ids=["mean", "weighted-nesterov", "fednova-scaffold", "weighted-nesterov-float16"])
def test_esync_round_over_allreduce_gives_the_parameter_servers_global_model(
        tmp_path, small_data, launcher, rule):
    """Same seeds, same unequal k_i (1 and 3 local steps): the models after every exchange
    agree to float rounding, so every rule and the outer optimizer run the same on both.
    (The two jobs run side by side: the result cannot depend on timing.)"""
    jobs = {collective: launcher(*quiet(tmp_path / collective, small_data, "-m", "esync",
                                        "--collective", collective, "--workers", 2,
                                        "--slowdown", "1", "--local-iters", KS, *rule, "-b", 8,
                                        "--max-rounds", ROUNDS, "--max-seconds", 0, "-e", 1,
                                        "--no-evaluator"))
            for collective in ("ps", "allreduce")}
    models = {}
    for collective, proc in jobs.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, (collective, out, err)
        folder = tmp_path / collective
        logs = device_logs(folder / "lenet" / "esync")
        assert [logs[d][-1]["k"] for d in ("cpu0", "cpu1")] == [1, 3]
        models[collective] = _final_model(folder)
    # Each worker's count: what it pushed (a ps worker) or what crossed its ring link, 2(N-1)/N
    # = 1 x the arrays for two workers: the same bytes.
    assert {r["bytes_pushed"] for d in logs.values() for r in d} == {
        r["bytes_pushed"] for d in device_logs(tmp_path / "ps" / "lenet" / "esync").values()
        for r in d}
    assert models["ps"].keys() == models["allreduce"].keys()
    for name, want in models["ps"].items():
        np.testing.assert_allclose(models["allreduce"][name], want, rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    # ... and the test can tell: the untrained model is far from either.
    untrained = CheckpointStore(tmp_path / "ps" / "lenet" / "esync" / "checkpoints")
    _, first = untrained.load(untrained.path_for(1), network="lenet")
    assert max(float(np.max(np.abs(first[n] - models["ps"][n]))) for n in first) > 1e-4


def test_killed_allreduce_worker_is_named_and_the_job_ends(tmp_path, fashion_data_dir, launcher):
    """The survivor's next allreduce fails at once (Horovod shuts down); the report names the
    worker that was killed, not the one that failed after it."""
    proc = launcher(*quiet(tmp_path, fashion_data_dir, "-m", "esync", "--collective",
                           "allreduce", "--workers", 2, "--slowdown", "1,2", "-b", 8,
                           "--max-seconds", 300))
    wait_for_rounds(proc, tmp_path / "lenet" / "esync", "cpu1", 2)
    os.kill(worker_pid(tmp_path, "cpu1"), signal.SIGKILL)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 1
    assert "worker-cpu1 died (killed by signal SIGKILL)" in err
    assert processes_of(tmp_path) == []

