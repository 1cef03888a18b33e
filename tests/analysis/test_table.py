"""table: time to target accuracy, speedup over SSGD, accuracy over repeated runs."""
import csv
import math

import pytest

import logmaker
from esync.analysis import summary, table
from esync.analysis.drawer import load_summaries


def quiet(_message):
    pass


def rows_by_mode(rows):
    return {row["mode"]: row for row in rows}


@pytest.fixture(scope="module")
def one_run(network_dir):
    network = logmaker.write_mode(network_dir.parent, "dcasgd").parent
    return load_summaries(network, notify=quiet)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The layout twice; the second run's accuracies 0.1 higher (sync reaches 0.8 at 4 s)."""
    runs = []
    for shift in (0.0, 0.1):
        root = tmp_path_factory.mktemp(f"rep{shift}")
        network = logmaker.write_layout(root, accuracy_shift=shift)
        runs.append(load_summaries(network, notify=quiet))
    return runs


@pytest.mark.parametrize("elapsed, acc, target, expected", [
    ([1, 2, 3], [0.5, 0.8, 0.9], 0.8, 2),
    ([1, 2, 3], [0.5, 0.79, 0.81], 0.8, 3),
    ([3, 1, 2], [0.9, 0.5, 0.85], 0.8, 2),
    ([1, 2], [0.5, 0.6], 0.8, None),
    ([], [], 0.8, None),
])
def test_time_to_accuracy(elapsed, acc, target, expected):
    assert table.time_to_accuracy(elapsed, acc, target) == expected


@pytest.mark.parametrize("elapsed, acc, target, expected", [
    ([4, 8, 12], [0.5, 0.8, 0.9], 0.85, 10.0),     # halfway between 0.8 and 0.9
    ([4, 8, 12], [0.5, 0.84, 0.94], 0.85, 8.4),
    ([4, 8], [0.9, 0.95], 0.85, 4),                # above at the first checkpoint
    ([4, 8, 12], [0.86, 0.5, 0.9], 0.85, 4),       # the first crossing counts
    ([4, 8], [0.5, 0.6], 0.85, None),
])
def test_time_to_accuracy_interpolates_between_the_checkpoints_around_the_crossing(
        elapsed, acc, target, expected):
    assert table.time_to_accuracy(elapsed, acc, target, interpolate=True) == (
        None if expected is None else pytest.approx(expected))


def test_time_to_accuracy_rejects_unequal_lengths():
    with pytest.raises(ValueError):
        table.time_to_accuracy([1, 2], [0.5], 0.8)


def test_time_to_target_comes_from_the_evaluator(one_run):
    rows = rows_by_mode(table.speedup_table([one_run]))
    assert rows["esync"]["time_to_target_s"] == 2.0    # 0.81 at 2 s
    assert rows["sync"]["time_to_target_s"] == 6.0     # 0.80 at 6 s
    assert rows["async"]["time_to_target_s"] == 4.0
    assert rows["local"]["time_to_target_s"] == pytest.approx(6 * logmaker.STANDALONE.step)


def test_speedup_is_sync_time_over_mode_time(one_run):
    rows = rows_by_mode(table.speedup_table([one_run]))
    assert rows["esync"]["speedup"] == pytest.approx(6.0 / 2.0)
    assert rows["async"]["speedup"] == pytest.approx(6.0 / 4.0)
    assert rows["sync"]["speedup"] == pytest.approx(1.0)


def test_mode_that_never_reaches_the_target(one_run):
    row = rows_by_mode(table.speedup_table([one_run]))["dcasgd"]
    assert row["time_to_target_s"] is None and row["speedup"] is None
    assert row["runs_reached"] == 0


def test_other_target(one_run):
    rows = rows_by_mode(table.speedup_table([one_run], target=0.5))
    assert rows["esync"]["time_to_target_s"] == 1.0
    assert rows["sync"]["time_to_target_s"] == 4.0
    assert rows["dcasgd"]["speedup"] == pytest.approx(4.0 / 4.0)


def test_one_run_has_zero_std_and_n_1(one_run):
    row = rows_by_mode(table.speedup_table([one_run]))["esync"]
    assert row["final_accuracy_mean"] == pytest.approx(0.86)
    assert row["final_accuracy_std"] == 0.0
    assert row["final_accuracy_runs"] == 1 and row["runs"] == 1


def test_standalone_accuracy_sits_next_to_every_mode(one_run):
    rows = table.speedup_table([one_run])
    assert all(row["standalone_accuracy_mean"] == pytest.approx(0.88) for row in rows)


def test_throughput_and_computing_ratio_come_from_the_totals(one_run):
    row = rows_by_mode(table.speedup_table([one_run]))["sync"]
    rounds = logmaker.ROUNDS["sync"]
    seconds = [dev.step + logmaker.AGGREGATE for dev in logmaker.CLUSTER]
    wall = rounds * max(seconds)
    assert row["throughput_samples_per_s"] == pytest.approx(4 * rounds * logmaker.BATCH / wall)
    ratios = [dev.step / s for dev, s in zip(logmaker.CLUSTER, seconds)]
    assert row["computing_time_ratio"] == pytest.approx(sum(ratios) / 4)


def test_repeated_runs_give_mean_and_sample_std(two_runs):
    rows = rows_by_mode(table.speedup_table(two_runs))
    esync = rows["esync"]
    assert esync["runs"] == 2
    assert esync["final_accuracy_mean"] == pytest.approx((0.86 + 0.96) / 2)
    assert esync["final_accuracy_std"] == pytest.approx(0.1 / math.sqrt(2))
    assert esync["standalone_accuracy_mean"] == pytest.approx((0.88 + 0.98) / 2)


def test_repeated_runs_average_the_times(two_runs):
    rows = rows_by_mode(table.speedup_table(two_runs))
    assert rows["sync"]["time_to_target_s"] == pytest.approx((6.0 + 4.0) / 2)
    assert rows["esync"]["speedup"] == pytest.approx(5.0 / 2.0)


def test_target_reached_in_some_runs_only_is_not_a_time(tmp_path):
    runs = []
    for shift in (0.0, 0.35):   # dcasgd: 0.5 at most, then 0.85 at 4 s
        network = logmaker.write_layout(tmp_path / f"r{shift}", modes=("sync", "dcasgd"),
                                        accuracy_shift=shift)
        runs.append(load_summaries(network, notify=quiet))
    rows = rows_by_mode(table.speedup_table(runs))
    assert rows["dcasgd"]["time_to_target_s"] is None
    assert rows["dcasgd"]["runs_reached"] == 1
    markdown = table.to_markdown(list(rows.values()), network="lenet", target=0.8)
    assert "not reached (1/2 runs reached it)" in markdown


def test_accuracy_falls_back_to_rank_0_device(tmp_path):
    mode_dir = logmaker.write_mode(tmp_path, "esync", evaluator=False)
    times, accs, source = table.accuracy_series(summary.summarize(mode_dir))
    assert source == "alpha/gpu0"
    assert accs == [0.1] * logmaker.ROUNDS["esync"]
    assert len(times) == len(accs)


def test_accuracy_of_an_original_summary_uses_elapsed_times():
    original = {"cloud3": {"gpu0": {"accuracy_list": [0.5, 0.85], "elapsed_time_list": [60, 120],
                                    "num_samples_list": [64, 64]}}}
    assert table.accuracy_series(original) == ([60, 120], [0.5, 0.85], "cloud3/gpu0")


def test_written_table_files(one_run, tmp_path):
    rows = table.speedup_table([one_run])
    md, path_csv = table.write_table(rows, tmp_path, network="lenet", target=0.8)
    text = md.read_text()
    assert md.name == "speedup.md" and path_csv.name == "speedup.csv"
    assert "Speedup and accuracy — lenet" in text and "n=1" in text
    assert ("| ESync | 1 | 2.0 | 3.00× | 0.38× (over Standalone SGD) | 0.860 ± 0.000 (n=1) "
            "| 0.880 ± 0.000 |") in text
    assert "| DC-ASGD | 1 | not reached | n/a |" in text
    with path_csv.open() as fp:
        parsed = list(csv.DictReader(fp))
    assert [r["mode"] for r in parsed] == ["esync", "sync", "async", "dcasgd", "local"]
    assert float(parsed[0]["speedup"]) == pytest.approx(3.0)
    assert parsed[3]["time_to_target_s"] == ""
