"""The first round holds the fast devices' work: nobody stops before every device is timed
(esync.coordination.job, the dynamic policy), on a real 2-worker cluster with one worker 50x
slower."""
from support import device_logs, run_cluster


def test_the_first_aggregate_holds_many_iterations_of_the_fast_device(tmp_path, fashion_data_dir):
    run_cluster(tmp_path, fashion_data_dir, "--workers", "2", "--slowdown", "1,50",
                "--emulation", "sleep", "-b", "8", "--max-rounds", "2", "--no-evaluator",
                "-e", "1", "--no-carry", "--sit-out-ratio", "0")   # the rule alone: x50 waited for
    logs = device_logs(tmp_path / "lenet" / "esync")
    fast, slow = logs["cpu0"], logs["cpu1"]
    assert slow[0]["num_samples"] == 8                  # one iteration of the x50 device
    # Before this rule the fast device stopped after one iteration (no duration was known).
    assert fast[0]["num_samples"] >= 8 * 10
