"""Fashion-MNIST for the workers: IDX files, loading, partitioning into shards, batch streams.

The data lives in the four standard IDX files under ``<data_dir>/fashion-mnist/``::

    train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
    t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz

Put the official files there, or make them with ``python scripts/prepare_data.py`` (see
``esync.worker.prepare``). MXNet's ``gluon.data.vision.FashionMNIST`` is not used: it downloads files
whose checksums differ from what it expects; this module's small reader is used instead.

Typical use in a worker::

    images, labels = load_fashion_mnist(data_dir, "train")
    shard = partition(labels, num_workers, rank, by_class=split_by_class == 1, seed=seed)
    stream = BatchStream(images[shard], labels[shard], batch_size=64, ctx=mx.cpu())
    data, label = stream.next_batch()

MXNet is imported only when a batch is made, so that the IDX tools (and ``esync.worker.prepare``) start
fast.
"""
import gzip
import math
import zlib
from pathlib import Path

import numpy as np

from esync.common.errors import UserError
from esync.common.files import atomic_open

NUM_CLASSES = 10
IMAGE_SIZE = 28

FASHION_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
ALL_FASHION_FILES = FASHION_FILES["train"] + FASHION_FILES["test"]
FASHION_SUBDIR = "fashion-mnist"

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


def _check_int(name, value, low):
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
    _check_int("num_parts", num_parts, 1)
    _check_int("part", part, 0)
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


# The -s values: how the training set is split over the workers and fed to each of them.
IID, CLASS_SORTED, CLASS_SORTED_SHUFFLED = 0, 1, 2
SPLITS = {
    IID: "i.i.d. (a random equal shard per worker, reshuffled every epoch)",
    CLASS_SORTED: "non-i.i.d. as in the original (a contiguous block of class-sorted data per "
                  "worker, fed in class order without shuffling: nearly single-class batches)",
    CLASS_SORTED_SHUFFLED: "milder non-i.i.d. (the same class blocks, reshuffled inside the "
                           "shard every epoch: batches mix the worker's classes)",
}


def training_shard(labels, num_parts, part, split=IID, seed=1):
    """``(indices in feed order, reshuffle every epoch?)`` of worker ``part``'s training shard.

    The stream that does not reshuffle (``CLASS_SORTED``) also keeps each pass's last partial
    batch (``BatchStream(keep_last=not reshuffle)``), as the original does.

    ``split`` is a -s value (``SPLITS``). ``CLASS_SORTED`` is the original's ClassSplitSampler:
    the shard's samples sorted by class (stable, so by index within a class) and walked in that
    order every epoch, so a batch holds one class, or two where classes meet.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    index = partition(labels, num_parts, part, by_class=split != IID, seed=seed)
    if split == CLASS_SORTED:
        index = index[np.argsort(np.asarray(labels)[index], kind="stable")]
    return index, split != CLASS_SORTED


# ---------------------------------------------------------------------------------------------
# Batches


def _mx():
    import mxnet  # imported on first use: it takes about a second

    return mxnet


def _check_images_labels(images, labels):
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim != 3:
        raise ValueError(f"images must have shape (N, H, W), got {images.shape}")
    if labels.shape != (len(images),):
        raise ValueError(f"labels must have shape ({len(images)},) to match the images, "
                         f"got {labels.shape}")
    return images, labels


def _to_float(images):
    """uint8 (N, H, W) -> float32 (N, 1, H, W) in [0, 1]; float input is taken as already scaled."""
    out = images.astype(np.float32)
    if images.dtype == np.uint8:
        out *= np.float32(1.0 / 255.0)
    return out[:, None, :, :]


def _to_nd(array, ctx):
    """float32 numpy -> NDArray on ctx (empty + copy: cheaper than ``mx.nd.array`` per batch)."""
    out = _mx().nd.empty(array.shape, ctx=ctx, dtype=np.float32)
    out[:] = array
    return out


def _make_batch(x, y, input_size, ctx):
    data = _to_nd(x, ctx)
    if x.shape[-1] != input_size or x.shape[-2] != input_size:
        data = _mx().nd.contrib.BilinearResize2D(data, height=input_size, width=input_size)
    return data, _to_nd(y, ctx)


class BatchStream:
    """Endless stream of full training batches over one shard, reshuffled (seeded) every epoch.

    ``next_batch()`` gives ``(data, label)``: data float32 (B, 1, S, S) in [0, 1] on ``ctx``,
    resized with one batched bilinear op when S differs from the image size; label float32 (B,).
    The shard is converted to float32 once; a batch costs one fancy index and one copy.

    Attributes: ``epoch`` (0-based index of the pass the last batch came from), ``samples_seen``
    (samples returned so far), ``num_samples``, ``batches_per_epoch``.

    ``keep_last``: end every pass with the smaller batch of the ``num_samples % batch_size``
    samples that are left, so each sample is fed once per pass. The class-sorted stream (-s 1)
    keeps it, as the original ESync's DataLoader does: dropping it would never train on the end
    of the shard's last class. Without it (the shuffled streams) the remainder of each pass is
    skipped; the next reshuffle puts other samples there.
    """

    def __init__(self, images, labels, batch_size, input_size=IMAGE_SIZE, ctx=None, seed=1,
                 shuffle=True, keep_last=False):
        images, labels = _check_images_labels(images, labels)
        _check_int("batch_size", batch_size, 1)
        _check_int("input_size", input_size, 1)
        if len(images) < batch_size:
            raise ValueError(f"the shard holds {len(images)} samples, fewer than one batch of "
                             f"{batch_size}; use a smaller batch size or fewer workers")
        self.batch_size = int(batch_size)
        self.input_size = int(input_size)
        self.ctx = ctx if ctx is not None else _mx().cpu()
        self.shuffle = shuffle
        self.keep_last = bool(keep_last)
        self.num_samples = len(images)
        self.batches_per_epoch = (-(-self.num_samples // self.batch_size) if self.keep_last
                                  else self.num_samples // self.batch_size)
        self.epoch = 0
        self.samples_seen = 0
        self._x = _to_float(images)
        self._y = labels.astype(np.float32)
        self._rng = np.random.RandomState(seed)
        self._order = self._new_order()
        self._pos = 0

    def _new_order(self):
        if self.shuffle:
            return self._rng.permutation(self.num_samples)
        return np.arange(self.num_samples)

    def next_batch(self):
        """Return the next ``(data, label)`` pair of NDArrays, starting a new epoch when needed."""
        needed = 1 if self.keep_last else self.batch_size
        if self._pos + needed > self.num_samples:
            self.epoch += 1
            self._order = self._new_order()
            self._pos = 0
        idx = self._order[self._pos:self._pos + self.batch_size]
        self._pos += len(idx)
        self.samples_seen += len(idx)
        return _make_batch(self._x[idx], self._y[idx], self.input_size, self.ctx)

    def __iter__(self):
        while True:
            yield self.next_batch()


def iterate_batches(images, labels, batch_size, input_size=IMAGE_SIZE, ctx=None):
    """Yield ``(data, label)`` over every sample once, in order (the last batch may be smaller).

    For evaluation; the same conversion as BatchStream, done batch by batch.
    """
    images, labels = _check_images_labels(images, labels)
    _check_int("batch_size", batch_size, 1)
    _check_int("input_size", input_size, 1)
    ctx = ctx if ctx is not None else _mx().cpu()
    for start in range(0, len(images), batch_size):
        x = _to_float(images[start:start + batch_size])
        y = labels[start:start + batch_size].astype(np.float32)
        yield _make_batch(x, y, input_size, ctx)
