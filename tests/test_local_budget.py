"""-m local: --max-seconds is wall time, and the default -e keeps scoring a small share of it.

Each run trains lenet on the first 3000 real Fashion-MNIST training images and scores the first
1000 test images inside the loop. The checks read the run's own logs, which record per round
the training time (``total_time``) and each phase, inline scoring (``evaluation``) included.
"""
import json
from pathlib import Path

import pytest

BUDGET_S = 4.0


def _run(main_py, data_dir, log_dir, *extra):
    result = main_py("-m", "local", "-c", "1", "-n", "lenet", "-b", "64", "-l", "0.001",
                     "-dd", data_dir, "-ld", log_dir, *extra, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    files = Path(log_dir, "lenet", "local").glob("*/*/iter-*.txt")
    logs = {int(f.stem.split("-")[1]): json.loads(f.read_text()) for f in files}
    return [logs[n] for n in sorted(logs)]


def _scoring(log):
    return log["time"]["0"].get("evaluation", 0.0)


def _round_work(log):
    return sum(v for k, v in log["time"]["0"].items() if k != "evaluation")


@pytest.fixture(scope="module")
def default_run(main_py, real_fashion_subset, tmp_path_factory):
    """One run with the default -e and a short wall-time budget; its round logs in order."""
    return _run(main_py, real_fashion_subset, tmp_path_factory.mktemp("budget") / "logs",
                "--max-seconds", BUDGET_S)


def test_max_seconds_ends_the_loop_at_the_wall_time_budget_plus_the_final_score(default_run):
    # The loop's wall time before the final score: the training clock plus every earlier score.
    before_final_score = default_run[-1]["total_time"] + sum(map(_scoring, default_run[:-1]))
    longest_round = max(map(_round_work, default_run))
    assert before_final_score <= BUDGET_S + 2 * longest_round + 0.5


def test_default_local_scoring_waits_nine_times_the_last_scores_duration(default_run):
    """Every round between the first score and the stop's is checked against the rule: a
    scored round trained at least 9x the previous score's duration since it, an unscored one
    had not yet (judged by the round before it, whose time its own decision time exceeds).
    The logs' times are rounded to microseconds, hence the 1e-5 s of slack."""
    rounds = default_run[:-1]                              # the stop's score aside
    assert rounds and _scoring(rounds[0]) > 0              # the first round starts the curve
    last, checked = rounds[0], []
    for prev, log in zip(rounds, rounds[1:]):
        took = _scoring(last)
        if _scoring(log) > 0:
            checked.append(("scored", log["total_time"] - last["total_time"] >= 9 * took - 1e-5))
            last = log
        else:
            checked.append(("not due", prev["total_time"] - last["total_time"] < 9 * took + 1e-5))
    assert checked and all(ok for _, ok in checked), [
        (n, kind, rounds[n]["total_time"], rounds[n]["time"]["0"])
        for n, (kind, ok) in enumerate(checked, start=1) if not ok]


def test_max_train_seconds_bounds_the_training_time_of_the_logs(main_py, real_fashion_subset,
                                                                  tmp_path):
    logs = _run(main_py, real_fashion_subset, tmp_path / "logs", "--max-train-seconds", 2,
                "-e", "50")
    assert 2.0 <= logs[-1]["total_time"] <= 2.0 + 2 * max(map(_round_work, logs)) + 0.5
