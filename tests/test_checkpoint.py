"""Tests of esync.common.checkpoint: round trips, validation, and atomic writes under SIGKILL."""
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from esync.common.checkpoint import CheckpointError, CheckpointStore

REPO = Path(__file__).resolve().parents[1]


def _arrays(value=1.0):
    return {"features.0.weight": np.full((4, 1, 3, 3), value, np.float32),
            "features.0.bias": np.arange(4, dtype=np.float32) + value,
            "output.weight": np.full((10, 4), -value, np.float32)}


def _shapes():
    return {name: a.shape for name, a in _arrays().items()}


def _save(store, round_no, value=1.0, network="lenet"):
    return store.save(round_no, _arrays(value), {"network": network, "total_time": 1.5,
                                                 "samples": 640})


def test_round_trip_gives_back_arrays_and_meta(tmp_path):
    store = CheckpointStore(tmp_path)
    path = _save(store, 12, value=2.5)
    assert path == tmp_path / "round-00000012.npz"
    meta, arrays = store.load(path, network="lenet", shapes=_shapes())
    assert meta["round"] == 12 and meta["network"] == "lenet" and meta["samples"] == 640
    assert list(arrays) == list(_arrays())
    for name, expected in _arrays(2.5).items():
        assert arrays[name].dtype == expected.dtype
        assert np.array_equal(arrays[name], expected)


def test_foreign_network_is_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    path = _save(store, 1, network="resnet18-v1")
    with pytest.raises(CheckpointError, match="resnet18-v1"):
        store.load(path, network="lenet")


def test_shape_mismatch_is_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    path = _save(store, 1)
    shapes = dict(_shapes(), **{"output.weight": (10, 8)})
    with pytest.raises(CheckpointError, match="output.weight"):
        store.load(path, network="lenet", shapes=shapes)


def test_missing_parameter_is_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    path = _save(store, 1)
    shapes = dict(_shapes(), **{"extra.bias": (3,)})
    with pytest.raises(CheckpointError, match="extra.bias"):
        store.load(path, network="lenet", shapes=shapes)


def _truncated(data):
    return data[:len(data) // 2]


def _flipped(data):
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


@pytest.mark.parametrize("damage", [
    _truncated,
    lambda data: data[:10],
    lambda data: b"",
    lambda data: bytes(random.Random(0).getrandbits(8) for _ in range(4096)),
    _flipped,
], ids=["truncated-half", "truncated-header", "empty", "garbage", "byte-flipped"])
def test_damaged_file_is_reported_as_corrupt(tmp_path, damage):
    store = CheckpointStore(tmp_path)
    path = _save(store, 1)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match="corrupt"):
        store.load(path)


def test_non_checkpoint_npz_is_refused(tmp_path):
    path = tmp_path / "round-00000001.npz"
    np.savez(path, __meta__=np.frombuffer(json.dumps({"format": "other"}).encode(), np.uint8))
    with pytest.raises(CheckpointError, match="not an esync checkpoint"):
        CheckpointStore(tmp_path).load(path)


def test_latest_returns_the_newest_round(tmp_path):
    store = CheckpointStore(tmp_path)
    for round_no in (2, 10, 9):
        _save(store, round_no, value=round_no)
    path, meta, arrays = store.latest()
    assert path.name == "round-00000010.npz" and meta["round"] == 10
    assert arrays["output.weight"][0, 0] == -10


def test_latest_of_an_empty_folder_is_none(tmp_path):
    assert CheckpointStore(tmp_path / "none").latest() is None


def test_list_ignores_temporary_files(tmp_path):
    store = CheckpointStore(tmp_path)
    _save(store, 1)
    (tmp_path / "round-00000002.npz.tmp").write_bytes(b"half written")
    assert store.list() == [tmp_path / "round-00000001.npz"]
    assert store.latest()[1]["round"] == 1


def test_done_marker_round_trip(tmp_path):
    store = CheckpointStore(tmp_path)
    assert not store.is_done()
    store.mark_done({"round": 3})
    assert store.is_done()
    store.clear_done()
    assert not store.is_done()


# atomicity under SIGKILL ----------------------------------------------------------------------

# The child saves 16 MB checkpoints in a loop, cycling over rounds 1-3 so that files are also
# replaced; every array is filled with a stamp that is also in the metadata, so a reader can tell
# a whole checkpoint from a mix of two. Writing the file is about a quarter of each save here, so
# a non-atomic save survives 16 random kills with a chance of about 0.75**16 = 1%.
SAVER = r"""
import sys
import numpy as np
from esync.common.checkpoint import CheckpointStore

store = CheckpointStore(sys.argv[1])
cycle = int(sys.argv[2])
for i in range(10**6):
    stamp = cycle * 10**6 + i
    arrays = {"big": np.full(4_000_000, stamp % 65536, np.float32),
              "small": np.full((7, 3), stamp, np.float64)}
    print("saving", i, flush=True)
    store.save(1 + i % 3, arrays, {"network": "big", "total_time": 0.0,
                                           "stamp": stamp})
"""

KILLS = 16


def _check_whole(store, path):
    meta, arrays = store.load(path, network="big",
                              shapes={"big": (4_000_000,), "small": (7, 3)})
    assert path.name == f"round-{meta['round']:08d}.npz"
    assert np.all(arrays["big"] == meta["stamp"] % 65536)
    assert np.all(arrays["small"] == meta["stamp"])


def test_checkpoints_survive_sigkill_whole_or_not_at_all(tmp_path):
    folder = tmp_path / "checkpoints"
    store = CheckpointStore(folder)
    rng = random.Random(20240601)
    killed_mid_run = 0
    for cycle in range(KILLS):
        child = subprocess.Popen([sys.executable, "-c", SAVER, str(folder), str(cycle)],
                                 cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            # Wait for three whole saves (rounds 1-3 exist), whatever the machine's speed,
            # then kill at a random moment of the following saves.
            for expected in range(4):
                line = child.stdout.readline()
                assert line.startswith(f"saving {expected}"), f"the saver said {line!r}"
            time.sleep(rng.uniform(0.02, 0.4))
            killed_mid_run += child.poll() is None
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
        for path in store.list():
            _check_whole(store, path)
    assert killed_mid_run == KILLS      # the saver was killed while it was saving, every time
    assert len(store.list()) >= 3       # there was something to check


def test_latest_at_most_skips_newer_checkpoints(tmp_path):
    store = CheckpointStore(tmp_path)
    for r in (2, 4, 6):
        _save(store, r)
    assert store.latest(at_most=5)[1]["round"] == 4
    assert store.latest(at_most=1) is None
    assert store.latest()[1]["round"] == 6


def _log(mode_dir, host, device, rounds):
    folder = mode_dir / host / device
    folder.mkdir(parents=True, exist_ok=True)
    for r in rounds:
        (folder / f"iter-{r}.txt").write_text("{}")


def test_a_restart_resumes_from_a_round_every_device_logged_and_forgets_the_rest(tmp_path):
    """Rank 0 checkpoints round 6 before the slow worker, then killed, logs it: resuming from 6
    would leave round 6 unlogged for that worker, so the restart goes back to round 4."""
    from esync.launch.launches import forget_rounds_after, rounds_logged_by_all
    store = CheckpointStore(tmp_path / "checkpoints")
    for r in (2, 4, 6):
        _save(store, r)
    _log(tmp_path, "localhost", "cpu0", range(1, 8))
    _log(tmp_path, "localhost", "cpu1", range(1, 6))
    (tmp_path / "evaluations.jsonl").write_text(
        "".join(json.dumps({"round": r, "accuracy": 0.5}) + "\n" for r in (2, 6, 4)))
    logged = rounds_logged_by_all(tmp_path, ["cpu0", "cpu1"])
    assert logged == 5
    assert rounds_logged_by_all(tmp_path, ["cpu0", "cpu1", "cpu2"]) == 0
    done = store.latest(at_most=logged)[1]["round"]
    assert done == 4
    forget_rounds_after(tmp_path, store, done)
    assert sorted(int(p.stem[5:]) for p in tmp_path.glob("*/cpu0/iter-*.txt")) == [1, 2, 3, 4]
    assert sorted(int(p.stem[5:]) for p in tmp_path.glob("*/cpu1/iter-*.txt")) == [1, 2, 3, 4]
    assert [p.name for p in store.list()] == ["round-00000002.npz", "round-00000004.npz"]
    assert [json.loads(line)["round"] for line in
            (tmp_path / "evaluations.jsonl").read_text().splitlines()] == [2, 4]
