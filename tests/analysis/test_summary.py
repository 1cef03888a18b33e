"""summary: hand-made logs with known numbers -> the figures recomputed here by hand."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import logmaker
from logmaker import AGGREGATE, BATCH, CLUSTER, PULLED, PUSHED, READY, RESET, ROUNDS
from esync.analysis import summary

REPO_ROOT = Path(__file__).resolve().parents[2]


def esync_round_seconds(dev):
    return dev.k * dev.step + (dev.k + 1) * READY + AGGREGATE + RESET


def sync_round_seconds(dev):
    return dev.step + AGGREGATE


@pytest.fixture(scope="module")
def esync_summary(network_dir):
    path = summary.write_summary(network_dir / "esync")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def sync_summary(network_dir):
    return summary.summarize(network_dir / "sync")


@pytest.fixture(scope="module")
def original_summary(tmp_path_factory):
    """Logs in the original's format: no extra keys, no evaluator."""
    root = tmp_path_factory.mktemp("original")
    mode_dir = logmaker.write_mode(root, "esync", extras=False, evaluator=False)
    (mode_dir / "run.json").unlink()
    return summary.summarize(mode_dir)


@pytest.mark.parametrize("folder, name", [
    ("esync", "ESync.json"), ("sync", "Sync.json"), ("async", "Async.json"),
    ("dcasgd", "DCASGD.json"), ("local", "Local.json"), ("esync-niid", "ESync-Non-IID.json"),
    ("sync-niid", "Sync-Non-IID.json"), ("async-niid", "Async-Non-IID.json"),
    ("dcasgd-niid", "DCASGD-Non-IID.json"), ("custom", "custom.json")])
def test_summary_name_follows_the_original(folder, name):
    assert summary.summary_name(folder) == name


def test_write_summary_puts_esync_json_in_the_mode_folder(network_dir, esync_summary):
    assert (network_dir / "esync" / "ESync.json").is_file()


def test_top_level_keys_are_hosts_and_underscore_entries(esync_summary):
    assert set(esync_summary) == {"alpha", "beta", "_totals", "_evaluator", "_run"}
    assert set(esync_summary["alpha"]) == {"gpu0", "cpu0"}
    assert set(esync_summary["beta"]) == {"gpu0", "cpu1"}


def test_original_keys_hold_the_logged_values(esync_summary):
    for dev in CLUSTER:
        entry = esync_summary[dev.host][dev.device]
        rounds = ROUNDS["esync"]
        assert entry["num_samples_list"] == [dev.k * BATCH] * rounds
        assert entry["self_iters_list"] == [dev.k + 1] * rounds
        assert entry["aggregate_time_list"] == [AGGREGATE] * rounds
        assert entry["elapsed_time_list"] == pytest.approx(
            [n * esync_round_seconds(dev) for n in range(1, rounds + 1)])


def test_accuracy_list_comes_from_the_device_that_logged_it(esync_summary):
    assert esync_summary["alpha"]["gpu0"]["accuracy_list"] == [0.1] * ROUNDS["esync"]
    assert esync_summary["alpha"]["cpu0"]["accuracy_list"] == []


def test_extra_lists_hold_the_logged_values(esync_summary):
    entry = esync_summary["beta"]["cpu1"]  # k=2, step 0.25, slow-down 2
    assert entry["k_list"] == [2, 2, 2]
    assert entry["compute_time_list"] == pytest.approx([0.5] * 3)
    assert entry["wait_time_list"] == pytest.approx([3 * READY + AGGREGATE + RESET] * 3)
    assert entry["bytes_pushed_list"] == [PUSHED] * 3
    assert entry["bytes_pulled_list"] == [PULLED] * 3
    assert entry["state_requests_list"] == [2] * 3
    assert (entry["slowdown"], entry["rank"]) == (2.0, 3)
    assert entry["compute_time_source"] == "logged"


def test_device_throughput_is_samples_over_last_total_time(esync_summary):
    for dev in CLUSTER:
        expected = dev.k * BATCH / esync_round_seconds(dev)
        assert esync_summary[dev.host][dev.device]["throughput"] == pytest.approx(expected)


def test_device_computing_time_ratio(esync_summary):
    for dev in CLUSTER:
        expected = dev.k * dev.step / esync_round_seconds(dev)
        entry = esync_summary[dev.host][dev.device]
        assert entry["computing_time_ratio"] == pytest.approx(expected)


def test_device_traffic_is_bytes_over_last_total_time(esync_summary):
    for dev in CLUSTER:
        expected = (PUSHED + PULLED) / esync_round_seconds(dev)
        assert esync_summary[dev.host][dev.device]["traffic_bytes_per_s"] == pytest.approx(expected)


def test_totals_of_the_esync_cluster(esync_summary):
    rounds = ROUNDS["esync"]
    wall = max(rounds * esync_round_seconds(dev) for dev in CLUSTER)
    samples = sum(rounds * dev.k * BATCH for dev in CLUSTER)
    ratios = [dev.k * dev.step / esync_round_seconds(dev) for dev in CLUSTER]
    totals = esync_summary["_totals"]
    assert totals["num_devices"] == 4
    assert totals["samples"] == samples
    assert totals["wall_time"] == pytest.approx(wall)
    assert totals["throughput"] == pytest.approx(samples / wall)
    assert totals["traffic_bytes_per_s"] == pytest.approx(4 * rounds * (PUSHED + PULLED) / wall)
    assert totals["mean_computing_time_ratio"] == pytest.approx(sum(ratios) / 4)
    assert totals["state_requests_per_round"] == pytest.approx(2.0)


def test_sync_logs_one_iteration_per_file(sync_summary):
    for dev in CLUSTER:
        entry = sync_summary[dev.host][dev.device]
        assert entry["self_iters_list"] == [1] * ROUNDS["sync"]
        assert entry["aggregate_time_list"] == [AGGREGATE] * ROUNDS["sync"]
        assert entry["throughput"] == pytest.approx(BATCH / sync_round_seconds(dev))
        assert entry["computing_time_ratio"] == pytest.approx(dev.step / sync_round_seconds(dev))


def test_local_has_no_aggregation(network_dir):
    entry = summary.summarize(network_dir / "local")["alpha"]["gpu0"]
    assert entry["aggregate_time_list"] == [0.0] * ROUNDS["local"]
    assert entry["computing_time_ratio"] == pytest.approx(1.0)
    assert entry["accuracy_list"] == logmaker.LOCAL_ACCURACIES


def test_evaluator_records_and_run_config_are_kept(esync_summary):
    evaluations = logmaker.EVALUATIONS["esync"]
    assert esync_summary["_evaluator"] == {
        "round_list": [r for r, _, _ in evaluations],
        "elapsed_time_list": [t for _, t, _ in evaluations],
        "accuracy_list": [a for _, _, a in evaluations],
        "samples_list": [r * BATCH * 4 for r, _, _ in evaluations]}
    assert esync_summary["_run"] == {"mode": "esync", "network": "lenet", "batch_size": BATCH}


def test_original_format_logs_summarise(original_summary):
    assert set(original_summary) == {"alpha", "beta", "_totals"}
    entry = original_summary["alpha"]["cpu0"]
    assert entry["num_samples_list"] == [BATCH] * ROUNDS["esync"]
    assert entry["k_list"] is None and entry["bytes_pushed_list"] is None
    assert entry["slowdown"] is None and entry["rank"] is None


def test_original_format_computing_time_is_the_sum_of_compute_phases(original_summary):
    for dev in CLUSTER:
        entry = original_summary[dev.host][dev.device]
        assert entry["compute_time_source"] == "phases"
        assert entry["compute_time_list"] == pytest.approx([dev.k * dev.step] * ROUNDS["esync"])
        assert entry["computing_time_ratio"] == pytest.approx(
            dev.k * dev.step / esync_round_seconds(dev))


def test_original_format_has_no_traffic(original_summary):
    assert original_summary["alpha"]["gpu0"]["traffic_bytes_per_s"] is None
    assert original_summary["_totals"]["traffic_bytes_per_s"] is None
    assert original_summary["_totals"]["throughput"] is not None


def test_collect_keys_rounds_by_number(network_dir):
    merged = summary.collect(network_dir / "sync")
    assert sorted(merged["beta"]["cpu1"]) == list(range(1, ROUNDS["sync"] + 1))
    assert merged["beta"]["cpu1"][2]["num_iters"] == 2


def test_any_hosts_and_devices_are_found_and_other_folders_ignored(fresh_network_dir):
    mode_dir = fresh_network_dir / "sync"
    extra = logmaker.Device("gamma", "cpu7", rank=4, slowdown=1.0, step=0.5, k=1)
    logmaker.write_device(mode_dir, "sync", extra, 2)
    (mode_dir / "checkpoints" / "round-1").mkdir(parents=True)
    result = summary.summarize(mode_dir)
    assert set(result["gamma"]) == {"cpu7"}
    assert "checkpoints" not in result
    assert result["_totals"]["num_devices"] == 5


def test_main_writes_the_non_iid_name(tmp_path, capsys):
    logmaker.write_mode(tmp_path, "sync-niid")
    code = summary.main(["-b", str(tmp_path), "-n", "lenet", "-m", "sync-niid"])
    assert code == 0
    assert (tmp_path / "lenet" / "sync-niid" / "Sync-Non-IID.json").is_file()
    assert "Sync-Non-IID.json" in capsys.readouterr().out


def test_wrapper_script_runs_from_another_folder(network_dir, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "analysis" / "summary.py"), "-b",
         str(network_dir.parent), "-n", "lenet", "-m", "async"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (network_dir / "async" / "Async.json").is_file()
