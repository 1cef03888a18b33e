"""esync-advise on a recorded run: a hand-written log folder in the launcher's layout (round logs,
evaluations.jsonl, run.json, as esync.analysis.summary reads them), its arithmetic against
values computed by hand, and its errors."""
from __future__ import annotations

import json

import pytest

from esync.analysis import advise

BATCH = 16
# host/device: (slow-down, iterations per round, computing seconds per round, "global update" s)
DEVICES = {"cpu0": (1, 8, 1.0, 0.5), "cpu1": (1, 8, 1.0, 0.5), "cpu2": (8, 1, 1.0, 0.25)}
ROUNDS = 2
# accuracy against global samples: 0.8 is crossed at 1000 + 2000 * 0.3 / 0.4 = 2500 samples
EVALUATIONS = [(1, 1.25, 0.5, 1000), (2, 2.5, 0.9, 3000)]


def write_logs(root, devices, run, evaluations=EVALUATIONS):
    """``root/lenet/esync``: the devices' round logs (host/device: (slow-down, iterations per
    round, computing s per round, "global update" s, logged iteration time or None)), the
    evaluator's records and ``run`` as run.json."""
    mode_dir = root / "lenet" / "esync"
    for device, (slowdown, k, compute, update, iteration) in devices.items():
        folder = mode_dir / "vm" / device
        folder.mkdir(parents=True)
        for n in range(1, ROUNDS + 1):
            phases = {str(i): {"forward and backward": compute / k} for i in range(k)}
            phases[str(k)] = {"check ready": 0.01, "global update": update}
            record = {"num_iters": n, "time": phases, "num_samples": k * BATCH,
                      "total_time": n * (compute + update), "k": k, "compute_time": compute,
                      "slowdown": slowdown}
            if iteration is not None:
                record["iteration_time"] = iteration
            (folder / f"iter-{n}.txt").write_text(json.dumps(record))
    (mode_dir / "evaluations.jsonl").write_text("".join(
        json.dumps({"round": r, "total_time": t, "accuracy": a, "samples": s}) + "\n"
        for r, t, a, s in evaluations))
    (mode_dir / "run.json").write_text(json.dumps(run))
    return mode_dir


def write_run(root, mode="esync", carry=True, evaluations=EVALUATIONS):
    """Three devices (``DEVICES``) in ``mode``."""
    return write_logs(root, {d: (*v, None) for d, v in DEVICES.items()},
                      {"mode": mode, "carry": carry, "use_dcasgd": 0}, evaluations)


def test_a_devices_speed_is_its_samples_over_its_computing_seconds(tmp_path):
    run = advise.read(write_run(tmp_path), 0.8)
    assert {d.name: d.samples_per_s for d in run.devices} == {
        "vm/cpu0": 128.0, "vm/cpu1": 128.0, "vm/cpu2": 16.0}


def test_the_exchange_is_the_shortest_median_aggregation_phase(tmp_path):
    assert advise.read(write_run(tmp_path), 0.8).exchange_s == 0.25


def test_the_samples_to_the_target_are_interpolated_between_checkpoints(tmp_path):
    assert advise.read(write_run(tmp_path), 0.8).samples_to_target == pytest.approx(2500)


def test_the_ldfolder_of_a_run_finds_its_mode_folder(tmp_path):
    write_run(tmp_path)
    assert advise.read(tmp_path, 0.8).folder == tmp_path / "lenet" / "esync"


def test_esync_on_every_device_rounds_up_to_whole_rounds_of_one_slowest_iteration(tmp_path):
    run = advise.read(write_run(tmp_path), 0.8)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"])
    # a round: 1.0 s (cpu2's iteration) + 0.25 s; 272 samples/s x 1.0 s + the fast devices'
    # 256 samples/s through the 0.25 s exchange (carry) = 336; ceil(2500 / 336) = 8 rounds
    assert (p.round_s, p.samples_per_round, p.rounds, p.time_s) == (1.25, 336, 8, 10.0)


def test_esync_without_the_slow_device_runs_short_rounds(tmp_path):
    run = advise.read(write_run(tmp_path), 0.8)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1"])
    # 0.125 + 0.25 s rounds of 256 x 0.125 + 128 x 0.25 = 64 samples: 40 rounds
    assert (p.round_s, p.samples_per_round, p.rounds, p.time_s) == (0.375, 64, 40, 15.0)


def test_esync_advice_includes_a_slow_device_that_saves_time(tmp_path):
    advice = advise.advise(advise.read(write_run(tmp_path), 0.8))
    assert [(v["device"], v["include"]) for v in advice["verdicts"]] == [("vm/cpu2", True)]


def write_sit_out_run(root):
    """Two x1 devices (8 iterations of 0.125 s a round, 0.5 s exchanges) and a x50 device that
    sat out from the start: no iteration, its warm-up's 6.25 s as its iteration time."""
    return write_logs(root, {"cpu0": (1, 8, 1.0, 0.5, 0.125), "cpu1": (1, 8, 1.0, 0.5, 0.125),
                             "cpu2": (1, 0, 0.0, 1.0, 6.25)},
                      {"mode": "esync", "carry": True, "use_dcasgd": 0,
                       "aggregation": "weighted", "policy": "dynamic", "sit_out_ratio": 16.0,
                       "batch_size": BATCH})


def test_a_device_that_sat_out_is_timed_by_its_warm_up(tmp_path):
    run = advise.read(write_sit_out_run(tmp_path), 0.8)
    cpu2 = next(d for d in run.devices if d.name == "vm/cpu2")
    assert (cpu2.iteration_s, cpu2.samples_per_iteration, run.sit_out) == (6.25, BATCH, 16.0)


def test_with_a_device_that_sits_out_only_the_first_round_waits_for_it(tmp_path):
    run = advise.read(write_sit_out_run(tmp_path), 0.8)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"])
    # round 1: cpu2's probe (6.25 s / 8 = 0.78125 s) + 0.5 s; 256 samples/s x 0.78125 s +
    # cpu1's 128 x 0.5 (carry) = 264. Then rounds of 8 x 0.125 = 1.0 s + 0.5 s of
    # 256 + 64 = 320 samples: ceil(2236 / 320) = 7; 1.28125 + 7 x 1.5 = 11.78125 s.
    assert (p.round_s, p.samples_per_round, p.rounds, p.time_s) == (1.5, 320, 8, 11.78125)
    alone = advise.predict(run, ["vm/cpu0", "vm/cpu1"])
    # Without it, rounds of one 0.125 s iteration + 0.5 s of 32 + 64 = 96: ceil(2500 / 96) = 27
    assert (alone.round_s, alone.rounds, alone.time_s) == (0.625, 27, 16.875)


def test_sync_rounds_are_one_iteration_of_every_device(tmp_path):
    run = advise.read(write_run(tmp_path, mode="sync", carry=False), 0.8)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"])
    # 48 samples per 1.25 s round: ceil(2500 / 48) = 53 rounds
    assert (p.samples_per_round, p.rounds, p.time_s) == (48, 53, pytest.approx(66.25))


def test_sync_advice_leaves_out_the_slow_device_that_costs_time(tmp_path):
    advice = advise.advise(advise.read(write_run(tmp_path, mode="sync", carry=False), 0.8))
    # without cpu2: 32 samples per 0.375 s: 79 rounds, 29.6 s against 66.25 s
    assert [(v["device"], v["include"]) for v in advice["verdicts"]] == [("vm/cpu2", False)]


def test_asgd_adds_each_devices_batch_per_iteration_and_exchange(tmp_path):
    run = advise.read(write_run(tmp_path, mode="async", carry=False), 0.8)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"])
    # 2 x 16 / 0.375 + 16 / 1.25 = 98.13 samples/s
    assert p.time_s == pytest.approx(2500 / (2 * 16 / 0.375 + 16 / 1.25))


def test_the_command_line_predicts_without_a_named_device(tmp_path, capsys):
    assert advise.main([str(write_run(tmp_path)), "--target", "0.8", "--without", "cpu2",
                        "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time_s"] == 15.0


def test_a_folder_without_logs_is_a_clear_error(tmp_path, capsys):
    assert advise.main([str(tmp_path)]) == 2
    assert "no run here" in capsys.readouterr().err


def test_a_device_that_is_not_in_the_run_is_a_clear_error(tmp_path, capsys):
    assert advise.main([str(write_run(tmp_path)), "--target", "0.8", "--without", "gpu7"]) == 2
    err = capsys.readouterr().err
    assert "'gpu7' is not a device of this run" in err and "vm/cpu2" in err


def test_a_target_the_run_never_reached_is_a_clear_error(tmp_path):
    with pytest.raises(advise.AdviceError, match="never reached 0.95"):
        advise.read(write_run(tmp_path), 0.95)


def test_a_run_without_evaluations_is_a_clear_error(tmp_path):
    mode_dir = write_run(tmp_path)
    (mode_dir / "evaluations.jsonl").unlink()
    with pytest.raises(advise.AdviceError, match="no evaluations"):
        advise.read(mode_dir, 0.8)
