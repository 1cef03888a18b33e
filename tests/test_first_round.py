"""The first round holds the fast devices' work: nobody stops before every device is timed
(esync.coordination.job, the dynamic policy), on a real 2-worker cluster with one worker 50x
slower."""
from support import device_logs, run_cluster


def test_the_first_aggregate_holds_many_iterations_of_the_fast_device(tmp_path, fashion_data_dir):
    run_cluster(tmp_path, fashion_data_dir, "--workers", "2", "--slowdown", "1,50",
                "--emulation", "sleep", "-b", "8", "--max-rounds", "2", "--no-evaluator",
                "-e", "1", "--no-carry")
    logs = device_logs(tmp_path / "lenet" / "esync")
    fast, slow = logs["cpu0"], logs["cpu1"]
    assert slow[0]["num_samples"] == 8                  # one iteration of the x50 device
    # Before this rule the fast device stopped after one iteration (no duration was known).
    assert fast[0]["num_samples"] >= 8 * 10


def test_a_device_50x_slower_runs_late_and_its_delta_is_folded_in(tmp_path, fashion_data_dir):
    """Rounds bounded by time (esync.worker.algorithms.esync.late): from round 2 on the x50
    device is not waited for; the fast device completes many rounds while it computes one
    iteration, and its late delta joins the round in which it arrives, scaled down. Rank 0
    never runs late (it writes the checkpoints): where the parameter server gave the x50
    device rank 0, the fast device's rounds wait for each of its iterations instead."""
    run_cluster(tmp_path, fashion_data_dir, "--workers", "2", "--slowdown", "1,50",
                "--emulation", "sleep", "-b", "8", "--max-rounds", "40", "--no-evaluator",
                "-e", "1", "--no-carry", "--aggregation", "weighted")
    logs = device_logs(tmp_path / "lenet" / "esync")
    fast, slow = logs["cpu0"], logs["cpu1"]
    late = [log for log in slow if log.get("late_rounds")]
    if slow[0]["rank"] == 0:
        assert not late and len(fast) == len(slow) == 40
        return
    assert late, "the slow device never ran late"
    assert all(log["k"] == 1 for log in late)
    # While it computed its one iteration, the fast device completed several rounds ...
    assert max(log["late_rounds"] for log in late) >= 3
    assert len(fast) >= len(slow) + 3
    # ... and the late delta was scaled down by the rounds it missed.
    first = late[0]
    assert first["late_weight"] == round(1 / (1 + first["late_rounds"]), 6)
