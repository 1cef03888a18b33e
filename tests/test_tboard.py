"""TensorBoard event files: what rank 0 and the evaluator write, read back through the format."""
import pytest

from esync.worker.tboard import (EventFileError, EvaluationScalars, TrainingScalars,
                          forget_earlier_events, read_scalars)


def write_two_rounds(folder, worker_ks=None):
    scalars = TrainingScalars(folder)
    for round_no in (1, 2):
        scalars.add_round(round_no, loss=2.5 - round_no, compute=0.5, round_seconds=1.0,
                          samples=64, elapsed=float(round_no),
                          worker_ks=worker_ks or {0: 3, 1: 1})
    scalars.close()


def test_round_scalars_are_read_back_per_round(tmp_path):
    write_two_rounds(tmp_path)
    assert read_scalars(tmp_path)["train/loss"] == [(1, 1.5), (2, 0.5)]


def test_throughput_is_samples_per_second_of_the_round(tmp_path):
    write_two_rounds(tmp_path)
    assert read_scalars(tmp_path)["train/throughput"] == [(1, 64.0), (2, 64.0)]


def test_computing_time_ratio_is_cumulative_compute_over_training_time(tmp_path):
    write_two_rounds(tmp_path)
    assert read_scalars(tmp_path)["train/computing_time_ratio"] == [(1, 0.5), (2, 0.5)]


def test_every_known_workers_k_gets_a_tag(tmp_path):
    write_two_rounds(tmp_path, worker_ks={0: 3, 1: 1, 2: 7})
    scalars = read_scalars(tmp_path)
    assert [scalars[f"k/worker{rank}"][-1][1] for rank in range(3)] == [3, 1, 7]


def test_accuracy_goes_against_round_and_training_milliseconds(tmp_path):
    scalars = EvaluationScalars(tmp_path)
    scalars.add_score(10, training_seconds=1.25, accuracy=0.5)
    scalars.close()
    read = read_scalars(tmp_path)
    assert (read["test/accuracy_by_round"], read["test/accuracy_by_time"]) == (
        [(10, 0.5)], [(1250, 0.5)])


def test_no_event_file_before_the_first_scalar(tmp_path):
    TrainingScalars(tmp_path / "tb").close()
    assert not (tmp_path / "tb").exists()


def test_two_writers_share_one_folder_as_one_run(tmp_path):
    write_two_rounds(tmp_path)
    scalars = EvaluationScalars(tmp_path)
    scalars.add_score(2, training_seconds=2.0, accuracy=0.7)
    scalars.close()
    assert {"train/loss", "test/accuracy_by_round"} <= set(read_scalars(tmp_path))


def test_a_damaged_event_file_is_refused(tmp_path):
    write_two_rounds(tmp_path)
    path = next(tmp_path.glob("events.out.tfevents.*"))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(EventFileError, match="checksum"):
        read_scalars(tmp_path)


def test_overwrite_forgets_the_earlier_runs_events(tmp_path):
    write_two_rounds(tmp_path)
    forget_earlier_events(tmp_path)
    assert read_scalars(tmp_path) == {}


def test_standalone_run_writes_its_test_accuracy(tmp_path, fashion_data_dir, main_py):
    done = main_py("-m", "local", "-c", "1", "-n", "lenet", "-b", "8", "-e", "2",
                   "--max-rounds", "4", "-dd", fashion_data_dir, "-ld", tmp_path / "logs",
                   "--tensorboard", tmp_path / "tb")
    assert done.returncode == 0, done.stderr
    assert [step for step, _ in read_scalars(tmp_path / "tb")["test/accuracy_by_round"]] == [2, 4]
