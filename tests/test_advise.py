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
ROUNDS = 3
ROUND_S = 1.5          # every round's length on the training clock, for every device
# accuracy against global samples: 0.8 is crossed at 1000 + 2000 * 0.3 / 0.4 = 2500 samples
EVALUATIONS = [(1, 1.5, 0.5, 1000), (2, 3.0, 0.9, 3000)]


def write_logs(root, devices, run, evaluations=EVALUATIONS, *, round_s=ROUND_S, start_s=0.0,
               wait_s=None):
    """``root/lenet/esync``: the devices' round logs (host/device: (slow-down, iterations per
    round, computing s per round, "global update" s, logged iteration time or None)), rounds of
    ``round_s`` after ``start_s`` of start-up, each device's wait the round's time it did not
    compute (or ``wait_s``), the evaluator's records and ``run`` as run.json."""
    mode_dir = root / "lenet" / "esync"
    for device, (slowdown, k, compute, update, iteration) in devices.items():
        folder = mode_dir / "vm" / device
        folder.mkdir(parents=True)
        for n in range(1, ROUNDS + 1):
            phases = {str(i): {"forward and backward": compute / k} for i in range(k)}
            phases[str(k)] = {"check ready": 0.01, "global update": update}
            record = {"num_iters": n, "time": phases, "num_samples": k * BATCH,
                      "total_time": start_s + n * round_s, "k": k, "compute_time": compute,
                      "slowdown": slowdown, "carried_iterations": 0,
                      "wait_time": round_s - compute if wait_s is None else wait_s}
            if iteration is not None:
                record["iteration_time"] = iteration
            (folder / f"iter-{n}.txt").write_text(json.dumps(record))
    (mode_dir / "evaluations.jsonl").write_text("".join(
        json.dumps({"round": r, "total_time": t, "accuracy": a, "samples": s}) + "\n"
        for r, t, a, s in evaluations))
    (mode_dir / "run.json").write_text(json.dumps(run))
    return mode_dir


def write_run(root, mode="esync", carry=True, evaluations=EVALUATIONS, devices=None, **clock):
    """Three devices (``DEVICES``) in ``mode``."""
    return write_logs(root, {d: (*v, None) for d, v in (devices or DEVICES).items()},
                      {"mode": mode, "carry": carry, "use_dcasgd": 0}, evaluations, **clock)


def test_a_devices_speed_is_its_samples_over_its_computing_seconds(tmp_path):
    run = advise.read(write_run(tmp_path), 0.8)
    assert {d.name: d.samples_per_s for d in run.devices} == {
        "vm/cpu0": 128.0, "vm/cpu1": 128.0, "vm/cpu2": 16.0}


def test_the_iterations_carried_through_an_exchange_count_in_a_devices_speed(tmp_path):
    mode_dir = write_run(tmp_path)
    for path in (mode_dir / "vm" / "cpu0").glob("iter-*.txt"):
        record = json.loads(path.read_text())     # 8 own and 2 carried iterations in 1.25 s
        record.update(carried_iterations=2, num_samples=10 * BATCH, compute_time=1.25)
        path.write_text(json.dumps(record))
    cpu0 = advise.read(mode_dir, 0.8).devices[0]
    assert (cpu0.iteration_s, cpu0.samples_per_s) == (0.125, 128.0)


def test_the_exchange_is_the_shortest_median_aggregation_phase(tmp_path):
    assert advise.read(write_run(tmp_path), 0.8).exchange_s == 0.25


def test_the_samples_to_the_target_are_interpolated_between_checkpoints(tmp_path):
    assert advise.read(write_run(tmp_path), 0.8).samples_to_target == pytest.approx(2500)


def test_the_ldfolder_of_a_run_finds_its_mode_folder(tmp_path):
    write_run(tmp_path)
    assert advise.read(tmp_path, 0.8).folder == tmp_path / "lenet" / "esync"


def test_every_round_pays_what_the_device_that_arrived_last_did_not_compute(tmp_path):
    # waits per round: cpu0 and cpu1 1.5 - 1.0, cpu2 1.5 - 1.0: the least, 0.5 s
    cal = advise.read(write_run(tmp_path), 0.8).calibration
    assert (cal.cost_s, cal.stretch_s, cal.slowest_s, cal.fill, cal.start_s) == (
        0.5, 0.0, 1.0, 1.0, 0.0)


def test_the_first_rounds_fill_is_its_samples_over_every_device_computing_all_through_it(
        tmp_path):
    # the run's first round: 1.5 s, 2 x 128 + 16 = 272 samples; the model has every device
    # compute all through it: 272 samples/s x 1.5 s = 408
    cal = advise.read(write_run(tmp_path), 0.8).calibration
    assert (cal.first_fill, cal.start_iteration_s) == (pytest.approx(272 / 408), 1.0)


def test_rounds_longer_than_their_compute_and_cost_are_the_slowest_devices_stretch(tmp_path):
    # rounds of 2.0 s, waits of 0.5 s: 2.0 - 1.0 (cpu2's iteration) - 0.5 = 0.5 s of stretch,
    # which a subset keeps while it keeps cpu2 and loses without it
    run = advise.read(write_run(tmp_path, round_s=2.0, wait_s=0.5), 0.8)
    assert (run.calibration.cost_s, run.calibration.stretch_s) == (0.5, 0.5)
    assert advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"]).round_s == 2.0
    assert advise.predict(run, ["vm/cpu1", "vm/cpu2"]).round_s == 2.0
    assert advise.predict(run, ["vm/cpu0", "vm/cpu1"]).round_s == 0.125 + 0.5


def test_the_first_rounds_lateness_is_the_start_and_comes_with_the_slowest_device(tmp_path):
    run = advise.read(write_run(tmp_path, start_s=0.75), 0.8)
    assert run.calibration.start_s == 0.75
    # the run's own pace: its first round ends at 2.25 s holding 272 samples, then 272 samples
    # per 1.5 s round
    assert advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"]).time_s == pytest.approx(
        2.25 + (2500 - 272) / 272 * 1.5)
    # without cpu2 the slowest iteration is 0.125 s against 1.0: an eighth of the lateness
    # (f1: 272 samples over 272/s x 2.25 s); rounds of 0.125 + 0.5 s holding 32 samples
    first_end = 0.625 + 0.75 * 0.125
    first_samples = 272 / (272 * 2.25) * 256 * first_end
    assert advise.predict(run, ["vm/cpu0", "vm/cpu1"]).time_s == pytest.approx(
        first_end + (2500 - first_samples) / 32 * 0.625)


def test_esync_on_every_device_crosses_the_target_within_a_round_of_one_slowest_iteration(
        tmp_path):
    run = advise.read(write_run(tmp_path), 0.8)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"])
    # a round: 1.0 s (cpu2's iteration) + 0.5 s; cpu2 computes its 1.0 s (16 samples), the
    # fast devices (carry) the round but their 0.5 s waits: 2 x 128 x 1.0; 272 samples, as the
    # run's rounds held (fill 1). The first round (1.5 s) holds its 272 samples; the other
    # 2228 take 8.19 rounds more: crossed in round 10, at 1.5 + 8.19 x 1.5 s
    assert (p.round_s, p.samples_per_round, p.rounds) == (1.5, 272, 10)
    assert p.time_s == pytest.approx(1.5 + (2500 - 272) / 272 * 1.5)


def test_esync_without_the_slow_device_runs_short_rounds(tmp_path):
    run = advise.read(write_run(tmp_path), 0.8)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1"])
    # 0.125 + 0.5 s rounds; both devices are now the slowest: one iteration each, 32 samples.
    # The first round: 0.625 s of both computing (256/s), times the run's first fill (2/3:
    # 272 of 408): 106.7 samples; the other 2393.3 in 74.8 rounds: crossed in round 76
    first_samples = 2 / 3 * 256 * 0.625
    assert (p.round_s, p.samples_per_round, p.rounds) == (0.625, 32, 76)
    assert p.time_s == pytest.approx(0.625 + (2500 - first_samples) / 32 * 0.625)


def test_a_runs_fill_scales_every_subsets_samples(tmp_path):
    # cpu0 and cpu1 computed 12 iterations (1.5 s) of each 2.0 s round though they logged 1.0 s
    # of waits: the run's rounds held 2 x 192 + 16 = 400 samples, the model's 2 x 128 x
    # (2.0 - 1.0) + 16 = 272; every subset's rounds hold 400 / 272 of the model's
    devices = {**DEVICES, "cpu0": (1, 12, 1.5, 0.5), "cpu1": (1, 12, 1.5, 0.5)}
    run = advise.read(write_run(tmp_path, devices=devices, round_s=2.0, wait_s=1.0), 0.8)
    assert run.calibration.fill == pytest.approx(400 / 272)
    assert advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"]).samples_per_round \
        == pytest.approx(400)
    assert advise.predict(run, ["vm/cpu0", "vm/cpu1"]).samples_per_round \
        == pytest.approx(32 * 400 / 272)


def test_esync_advice_includes_a_slow_device_that_saves_time(tmp_path):
    advice = advise.advise(advise.read(write_run(tmp_path), 0.8))
    assert [(v["device"], v["include"]) for v in advice["verdicts"]] == [("vm/cpu2", True)]


def test_predictions_within_five_percent_keep_the_device():
    assert advise.keeps(10.4, 10.0) and advise.keeps(9.0, 10.0)
    assert not advise.keeps(10.6, 10.0)


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
    # cost 0.5 (the fast devices' waits); rounds of 8 x 0.125 = 1.0 s of compute + 0.5 s; the
    # first: cpu2's probe (6.25 s / 8 = 0.78125 s) + 0.5 s, which the run's 1.5 s first round
    # outlasted by 0.21875 s (the start)
    assert (run.calibration.cost_s, run.calibration.start_s) == (0.5, 0.21875)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"])
    # round 1: 1.28125 + 0.21875 = 1.5 s of the fast pair computing (256/s) times the run's
    # first fill (256 of 384: 2/3): 256 samples; then 2 x 128 x (1.5 - 0.5) = 256 a round:
    # 2244 more in 8.77 rounds, crossed in round 10
    assert (p.round_s, p.samples_per_round, p.rounds) == (1.5, 256, 10)
    assert p.time_s == pytest.approx(1.5 + (2500 - 256) / 256 * 1.5)
    alone = advise.predict(run, ["vm/cpu0", "vm/cpu1"])
    # Without it, rounds of one 0.125 s iteration + 0.5 s of 32 samples, the first later by
    # 0.125 / 6.25 of the start
    first_end = 0.625 + 0.21875 * 0.125 / 6.25
    first_samples = 2 / 3 * 256 * first_end
    assert (alone.round_s, alone.rounds) == (0.625, 76)
    assert alone.time_s == pytest.approx(first_end + (2500 - first_samples) / 32 * 0.625)


def test_a_subset_whose_rounds_hold_far_fewer_iterations_comes_with_a_caveat(tmp_path):
    run = advise.read(write_sit_out_run(tmp_path), 0.8)
    advice = advise.advise(run)
    steps = {label: p.local_steps for label, p in advice["predictions"]}
    # every device: the fast ones compute through 1.5 - 0.5 s of a round, 8 iterations of
    # 0.125 s; alone, rounds of one iteration each: 8 times fewer, a caveat
    assert steps == {"every device": 8.0, "without vm/cpu2": 1.0}
    assert [c.split(":")[0] for c in advice["caveats"]] == ["without vm/cpu2"]
    assert "caveat: without vm/cpu2: its fastest device's iterations a round: about 1, against the run's 8;" in "\n".join(
        advise.render(run, advice))


def test_sync_rounds_of_one_iteration_whoever_runs_carry_no_caveat(tmp_path):
    run = advise.read(write_run(tmp_path, mode="sync", carry=False, devices=SYNC_DEVICES), 0.8)
    assert advise.advise(run)["caveats"] == []


SYNC_DEVICES = {"cpu0": (1, 1, 0.125, 0.5), "cpu1": (1, 1, 0.125, 0.5), "cpu2": (8, 1, 1.0, 0.25)}


def test_sync_rounds_are_one_iteration_of_every_device(tmp_path):
    run = advise.read(write_run(tmp_path, mode="sync", carry=False, devices=SYNC_DEVICES), 0.8)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"])
    # 48 samples per 1.0 + 0.5 s round (cpu2 waited least: 1.5 - 1.0), the first round too:
    # 2452 samples after it, 51.08 rounds: crossed in round 53
    assert (p.samples_per_round, p.rounds) == (48, 53)
    assert p.time_s == pytest.approx(1.5 + (2500 - 48) / 48 * 1.5)


def test_sync_advice_leaves_out_the_slow_device_that_costs_time(tmp_path):
    run = advise.read(write_run(tmp_path, mode="sync", carry=False, devices=SYNC_DEVICES), 0.8)
    advice = advise.advise(run)
    # without cpu2: 32 samples per 0.125 + 0.5 s: 48.8 s against 78.1 s
    assert [(v["device"], v["include"]) for v in advice["verdicts"]] == [("vm/cpu2", False)]


def test_asgd_adds_the_samples_per_second_each_device_added(tmp_path):
    run = advise.read(write_run(tmp_path, mode="async", carry=False), 0.8)
    p = advise.predict(run, ["vm/cpu0", "vm/cpu1", "vm/cpu2"])
    # 3 rounds of 128, 128 and 16 samples in 4.5 s
    assert p.time_s == pytest.approx(2500 / ((128 + 128 + 16) * 3 / 4.5))


def test_the_command_line_predicts_without_a_named_device(tmp_path, capsys):
    assert advise.main([str(write_run(tmp_path)), "--target", "0.8", "--without", "cpu2",
                        "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time_s"] == pytest.approx(
        0.625 + (2500 - 2 / 3 * 256 * 0.625) / 32 * 0.625)


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


def test_who_sat_out_is_read_from_the_run_not_judged_again(tmp_path):
    """A 16:1 run of the sweep: both x16 devices sat out (their warm-up probes read over 32x
    the x1 devices' probes), but one probe, 2.44 s, was under 32 x the x1's 0.0765 s
    iteration: judged again by iterations, it computed, rounds lasted its 2.44 s, and the
    prediction came 2.7x late (81 s). The state server judged by timings the logs do not all
    keep, so the advisor takes its judgment from the logs: here a device at 28x that
    computed nothing."""
    mode_dir = write_logs(tmp_path, {"cpu0": (1, 8, 1.0, 0.5, 0.125),
                                     "cpu1": (1, 8, 1.0, 0.5, 0.125),
                                     "cpu2": (16, 0, 0.0, 1.0, 3.5)},
                          {"mode": "esync", "carry": True, "use_dcasgd": 0,
                           "aggregation": "weighted", "policy": "dynamic",
                           "sit_out_ratio": 32.0, "batch_size": BATCH})
    run = advise.read(mode_dir, 0.8)
    assert [d.sat_out for d in run.devices] == [False, False, True]
    p = advise.predict(run, [d.name for d in run.devices])
    # rounds of 8 x 0.125 s of the fast pair's compute + their 0.5 s, not of cpu2's 3.5 s
    assert (p.round_s, p.samples_per_round) == (1.5, 256)


def test_a_device_with_a_round_of_no_iteration_has_not_sat_out(tmp_path):
    """A x16 device of a 16:1 run computes no iteration in a round now and then (its
    iteration ran over the round's end): it takes part; only nothing in the second half of
    its rounds is sitting out."""
    run = advise.read(write_run(tmp_path), 0.8)
    entry = advise.summary_mod.summarize(run.folder)
    cpu2 = next(e for h, d, e in advise.summary_mod.device_entries(entry) if d == "cpu2")
    assert not advise.device_of("vm/cpu2", {**cpu2, "num_samples_list": [16, 0, 16]}, 16).sat_out
    assert advise.device_of("vm/cpu2", {**cpu2, "num_samples_list": [16, 0, 0]}, 16).sat_out
