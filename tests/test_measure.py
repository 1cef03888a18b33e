"""Tests of esync.worker.measure: phase timers that wait for MXNet's engine; the per-round log files."""
import json
import time

import mxnet as mx
import pytest

from esync.worker.measure import LogDirError, RoundLogWriter, RoundRecord

N = 1500   # a 1500x1500 dot: ~7 GFLOP, a tenth of a second or more on one core


@pytest.fixture(scope="module")
def matrices():
    a = mx.nd.random.uniform(shape=(N, N))
    b = mx.nd.random.uniform(shape=(N, N))
    mx.nd.dot(a, b).wait_to_read()   # warm-up: first call allocates
    return a, b


def _waited_dot(a, b):
    start = time.perf_counter()
    mx.nd.dot(a, b).wait_to_read()
    return time.perf_counter() - start


def _enqueue_dot(a, b):
    start = time.perf_counter()
    c = mx.nd.dot(a, b)
    seconds = time.perf_counter() - start
    c.wait_to_read()
    return seconds


def test_phase_time_includes_the_engine_work(matrices):
    a, b = matrices
    reference = min(_waited_dot(a, b) for _ in range(3))
    enqueue = min(_enqueue_dot(a, b) for _ in range(3))
    record = RoundRecord(1)
    record.begin_iteration()
    with record.phase("dot"):
        mx.nd.dot(a, b)
    measured = record.current()["dot"]
    assert reference > 10 * enqueue          # the op is asynchronous: enqueueing is cheap
    assert measured > 0.5 * reference        # the phase waited for the result
    assert measured > 10 * enqueue


def test_phase_does_not_charge_earlier_work_to_itself(matrices):
    a, b = matrices
    reference = min(_waited_dot(a, b) for _ in range(3))
    record = RoundRecord(1)
    record.begin_iteration()
    pending = mx.nd.dot(a, b)      # enqueued before the phase starts
    with record.phase("nothing"):
        pass
    pending.wait_to_read()
    assert record.current()["nothing"] < 0.5 * reference


def test_phases_of_the_same_name_add_up():
    record = RoundRecord(1)
    record.begin_iteration()
    record.add("get_batch", 0.25)
    record.add("get_batch", 0.5)
    assert record.current() == {"get_batch": 0.75}


def test_iterations_are_numbered_from_zero_as_strings():
    record = RoundRecord(4)
    for seconds in (0.1, 0.2):
        record.begin_iteration()
        record.add("forward and backward", seconds)
    assert record.time == {"0": {"forward and backward": 0.1}, "1": {"forward and backward": 0.2}}
    assert record.seconds("forward and backward") == pytest.approx(0.3)


def test_drop_empty_iteration_removes_an_iteration_without_phases():
    record = RoundRecord(1)
    record.begin_iteration()
    record.add("get_batch", 0.1)
    record.begin_iteration()
    record.drop_empty_iteration()
    assert list(record.time) == ["0"]
    record.add("global update", 0.2)   # later phases go to the last real iteration
    assert record.time["0"] == {"get_batch": 0.1, "global update": 0.2}


def test_drop_empty_iteration_keeps_an_iteration_with_phases():
    record = RoundRecord(1)
    record.begin_iteration()
    record.add("get_batch", 0.1)
    record.drop_empty_iteration()
    assert record.time == {"0": {"get_batch": 0.1}}


def test_next_iteration_after_a_drop_reuses_the_index():
    record = RoundRecord(1)
    record.begin_iteration()
    record.drop_empty_iteration()
    record.begin_iteration()
    record.add("get_batch", 0.1)
    assert record.time == {"0": {"get_batch": 0.1}}


# log files -------------------------------------------------------------------------------------


def _record(number=3):
    record = RoundRecord(number)
    record.begin_iteration()
    record.add("get_batch", 0.01)
    record.add("forward and backward", 0.02)
    record.num_samples = 64
    return record


def test_log_file_has_the_original_format(tmp_path):
    path = RoundLogWriter(tmp_path / "cpu0").write(_record(3), total_time=12.3456789)
    assert path == tmp_path / "cpu0" / "iter-3.txt"
    log = json.loads(path.read_text())
    assert log == {"num_iters": 3, "num_samples": 64, "total_time": 12.345679,
                   "time": {"0": {"get_batch": 0.01, "forward and backward": 0.02}}}


def test_accuracy_is_written_only_when_given(tmp_path):
    writer = RoundLogWriter(tmp_path)
    with_acc = json.loads(writer.write(_record(1), 1.0, accuracy=0.81).read_text())
    without = json.loads(writer.write(_record(2), 2.0).read_text())
    assert with_acc["accuracy"] == 0.81
    assert "accuracy" not in without


def test_extras_are_merged_into_the_log(tmp_path):
    record = _record(1)
    record.extras = {"k": 5, "bytes_pushed": 1024}
    log = json.loads(RoundLogWriter(tmp_path).write(record, 1.0).read_text())
    assert log["k"] == 5 and log["bytes_pushed"] == 1024 and log["num_iters"] == 1


def test_writer_leaves_no_temporary_files(tmp_path):
    writer = RoundLogWriter(tmp_path)
    for n in (1, 2):
        writer.write(_record(n), float(n))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter-1.txt", "iter-2.txt"]


def test_folder_with_earlier_logs_is_refused(tmp_path):
    RoundLogWriter(tmp_path).write(_record(1), 1.0)
    with pytest.raises(LogDirError, match="--overwrite"):
        RoundLogWriter(tmp_path)


def test_overwrite_deletes_earlier_logs(tmp_path):
    writer = RoundLogWriter(tmp_path)
    for n in (1, 2, 3):
        writer.write(_record(n), float(n))
    RoundLogWriter(tmp_path, overwrite=True)
    assert list(tmp_path.glob("iter-*.txt")) == []


def test_resume_keeps_earlier_logs(tmp_path):
    writer = RoundLogWriter(tmp_path)
    for n in (1, 2):
        writer.write(_record(n), float(n))
    RoundLogWriter(tmp_path, resume=True).write(_record(3), 3.0)
    assert sorted(p.name for p in tmp_path.glob("iter-*.txt")) == [
        "iter-1.txt", "iter-2.txt", "iter-3.txt"]


def test_folder_under_a_file_is_a_log_dir_error_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LogDirError, match="not writable") as info:
        RoundLogWriter(blocker / "sub")
    assert str(blocker / "sub") in str(info.value)


def _strict(text):
    def refuse(name):
        raise ValueError(f"{name} in a log")
    return json.loads(text, parse_constant=refuse)


def test_a_diverged_loss_is_written_as_null(tmp_path):
    """JSON has no NaN: a diverged run's log must still be JSON every reader accepts."""
    record = _record(1)
    record.extras = {"k": 3, "train_loss": float("nan"), "other": float("inf")}
    log = _strict(RoundLogWriter(tmp_path).write(record, 1.0).read_text())
    assert log["train_loss"] is None and log["other"] is None and log["k"] == 3
