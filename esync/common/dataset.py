"""Fashion-MNIST's files and shards: IDX files, loading a split, cutting the training set.

The data lives in the four standard IDX files under ``<data_dir>/fashion-mnist/``::

    train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
    t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz

Put the official files there, or make them with ``python scripts/prepare_data.py`` (see
``esync.worker.prepare``). MXNet's ``gluon.data.vision.FashionMNIST`` is not used: it downloads
files whose checksums differ from what it expects; this module's small reader is used instead.

Typical use in a worker (the batches are ``esync.worker.data``'s)::

    images, labels = load_fashion_mnist(data_dir, "train")
    shard, reshuffle = training_shard(labels, num_workers, rank, split_by_class, seed=seed)
    stream = BatchStream(images[shard], labels[shard], batch_size=64, ctx=mx.cpu())

numpy only, no MXNet: the launcher reads the labels here to name each shard's classes, and cuts
them with the workers' own ``training_shard``.
"""
import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from esync.common.catalog import (ALL_FASHION_FILES, FASHION_FILES, FASHION_SUBDIR, IMAGE_SIZE,
                                  NUM_CLASSES)
from esync.common.errors import UserError
from esync.common.files import atomic_open
from esync.common.modes import CLASS_SORTED, IID, SPLIT_VALUES

# IDX type byte -> numpy dtype (the payload is big-endian).
_IDX_TYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_CODES = {dt.newbyteorder("="): code for code, dt in _IDX_TYPES.items()}


class DataError(UserError):
    """A data file or folder is missing, malformed or inconsistent; the message says the fix."""


def _fix_hint(folder):
    data_dir = Path(folder).parent
    return (f"run `python scripts/prepare_data.py --data-dir {data_dir}` or put the official "
            f"Fashion-MNIST files in {Path(folder)}/")


# ---------------------------------------------------------------------------------------------
# IDX files


def _read_bytes(path):
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    if path.suffix != ".gz":
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except EOFError as exc:
        raise DataError(f"{path}: gzip stream is truncated ({exc}); the file was cut short, "
                        f"fetch or prepare it again") from exc
    except (OSError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt gzip file ({exc}); fetch or prepare it again") from exc


def read_idx(path):
    """Read an IDX file (``.gz`` or plain, by suffix) into a numpy array in native byte order.

    Raises DataError for a missing file, corrupt gzip, bad magic number, unknown type, or a
    payload whose length does not match the header (truncated or with trailing bytes).
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DataError(f"{path}: truncated IDX file ({len(raw)} bytes, no complete header)")
    zero, type_code, ndim = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or type_code not in _IDX_TYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number 0x{raw[:4].hex()}; "
                        f"expected 0x000008XX, e.g. 0x00000803 for images, 0x00000801 for labels)")
    if ndim < 1:
        raise DataError(f"{path}: bad IDX header (dimension count {ndim}, must be at least 1)")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DataError(f"{path}: truncated IDX file (header needs {header_len} bytes, "
                        f"file has {len(raw)})")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dtype = _IDX_TYPES[type_code]
    expected = math.prod(shape) * dtype.itemsize
    got = len(raw) - header_len
    if got < expected:
        raise DataError(f"{path}: truncated IDX file (header says shape {shape}: {expected} bytes "
                        f"of data, file has {got})")
    if got > expected:
        raise DataError(f"{path}: malformed IDX file ({got - expected} unexpected bytes after "
                        f"the data of shape {shape})")
    array = np.frombuffer(raw, dtype=dtype, count=expected // dtype.itemsize, offset=header_len)
    return array.astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def write_idx(path, array, *, compresslevel=6):
    """Write ``array`` as an IDX file, gzip-compressed when ``path`` ends in ``.gz``.

    The write is atomic and durable (``esync.common.files``), and the gzip header carries no name and
    no time stamp, so the same array always gives the same bytes.
    """
    path = Path(path)
    array = np.asarray(array)
    code = _IDX_CODES.get(array.dtype.newbyteorder("="))
    if code is None:
        raise ValueError(f"write_idx: dtype {array.dtype} has no IDX type code "
                         f"(use uint8, int8, int16, int32, float32 or float64)")
    if not 1 <= array.ndim <= 255:
        raise ValueError(f"write_idx: array must have 1 to 255 dimensions, got {array.ndim}")
    header = bytes([0, 0, code, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape)
    payload = np.ascontiguousarray(array, dtype=_IDX_TYPES[code]).tobytes()
    with atomic_open(path, "wb", durable=True) as f:
        if path.suffix == ".gz":
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0,
                               compresslevel=compresslevel) as gz:
                gz.write(header)
                gz.write(payload)
        else:
            f.write(header)
            f.write(payload)


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST


def load_fashion_mnist(data_dir, split):
    """Return ``(images uint8 [N, 28, 28], labels uint8 [N])`` of ``split`` ("train" or "test").

    Reads ``<data_dir>/fashion-mnist/``; every problem is a DataError that says how to fix it.
    """
    if split not in FASHION_FILES:
        raise ValueError(f"split must be one of {sorted(FASHION_FILES)}, got {split!r}")
    folder = Path(data_dir) / FASHION_SUBDIR
    hint = _fix_hint(folder)
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise DataError(f"Fashion-MNIST folder {folder} {what}; {hint}")
    names = sorted(p.name for p in folder.iterdir())
    if not names:
        raise DataError(f"Fashion-MNIST folder {folder} is empty; {hint}")
    if not set(names) & set(ALL_FASHION_FILES):
        raise DataError(f"Fashion-MNIST folder {folder} holds none of the IDX files "
                        f"({', '.join(ALL_FASHION_FILES)}); {hint}")
    image_path, label_path = (folder / name for name in FASHION_FILES[split])
    for p in (image_path, label_path):
        if not p.is_file():
            raise DataError(f"Fashion-MNIST file {p} is missing; {hint}")
    try:
        images, labels = read_idx(image_path), read_idx(label_path)
    except DataError as exc:
        raise DataError(f"{exc}; {hint}") from exc
    check_fashion_arrays(images, labels, image_path, label_path, hint=hint)
    return images, labels


def check_fashion_arrays(images, labels, image_path, label_path, *, hint=""):
    """Raise DataError unless images are uint8 [N, 28, 28] and labels uint8 [N] in 0..9."""
    suffix = f"; {hint}" if hint else ""
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (IMAGE_SIZE,) * 2:
        raise DataError(f"{image_path}: expected uint8 images of shape (N, 28, 28), got "
                        f"{images.dtype} {images.shape}{suffix}")
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise DataError(f"{label_path}: expected uint8 labels of shape (N,), got "
                        f"{labels.dtype} {labels.shape}{suffix}")
    if len(images) != len(labels):
        raise DataError(f"{image_path} holds {len(images)} images but {label_path} holds "
                        f"{len(labels)} labels; the files do not belong together{suffix}")
    if len(labels) and labels.max() >= NUM_CLASSES:
        bad = int(np.count_nonzero(labels >= NUM_CLASSES))
        raise DataError(f"{label_path}: {bad} labels outside 0..{NUM_CLASSES - 1} "
                        f"(largest {int(labels.max())}){suffix}")


# ---------------------------------------------------------------------------------------------
# Partitioning


def check_int(name, value, low):
    """ValueError unless ``value`` is an integer >= ``low`` (``name`` says which)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be at least {low}, got {value}")


def partition(labels, num_parts, part, by_class=False, seed=1):
    """Indices (ascending, int64) of the samples that worker ``part`` of ``num_parts`` trains on.

    i.i.d. (``by_class=False``): a permutation drawn from ``RandomState(seed)`` cut into
    ``num_parts`` equal disjoint shards. By class: the indices stably sorted by label, cut into
    contiguous equal blocks (with 2 workers on balanced data, worker 0 gets classes 0-4); the seed
    plays no part. Both drop the ``len(labels) % num_parts`` samples that are left over.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {labels.shape}")
    check_int("num_parts", num_parts, 1)
    check_int("part", part, 0)
    if part >= num_parts:
        raise ValueError(f"part must be in 0..{num_parts - 1} (num_parts={num_parts}), got {part}")
    size = len(labels) // num_parts
    if size == 0:
        raise ValueError(f"cannot split {len(labels)} samples into {num_parts} non-empty parts")
    if by_class:
        order = np.argsort(labels, kind="stable")
    else:
        order = np.random.RandomState(seed).permutation(len(labels))
    return np.sort(order[part * size:(part + 1) * size]).astype(np.int64)


def training_shard(labels, num_parts, part, split=IID, seed=1):
    """``(indices in feed order, reshuffle every epoch?)`` of worker ``part``'s training shard.

    The stream that does not reshuffle (``CLASS_SORTED``) also keeps each pass's last partial
    batch (``BatchStream(keep_last=not reshuffle)``), as the original does.

    ``split`` is a -s value (``esync.common.modes.SPLITS``). ``CLASS_SORTED`` is the original's
    ClassSplitSampler:
    the shard's samples sorted by class (stable, so by index within a class) and walked in that
    order every epoch, so a batch holds one class, or two where classes meet.
    """
    if split not in SPLIT_VALUES:
        raise ValueError(f"split must be one of {sorted(SPLIT_VALUES)}, got {split!r}")
    index = partition(labels, num_parts, part, by_class=split != IID, seed=seed)
    if split == CLASS_SORTED:
        index = index[np.argsort(np.asarray(labels)[index], kind="stable")]
    return index, split != CLASS_SORTED
