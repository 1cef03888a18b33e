"""Batches for the workers: a shard's samples as MXNet arrays, endlessly or once through.

The files and the shards are ``esync.common.dataset``'s::

    images, labels = load_fashion_mnist(data_dir, "train")
    shard, reshuffle = training_shard(labels, num_workers, rank, split_by_class, seed=seed)
    stream = BatchStream(images[shard], labels[shard], batch_size=64, ctx=mx.cpu(),
                         shuffle=reshuffle)
    data, label = stream.next_batch()

MXNet is imported only when a batch is made, so that importing this module stays fast.
"""
import numpy as np

from esync.common.catalog import IMAGE_SIZE
from esync.common.dataset import check_int


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
        check_int("batch_size", batch_size, 1)
        check_int("input_size", input_size, 1)
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
    check_int("batch_size", batch_size, 1)
    check_int("input_size", input_size, 1)
    ctx = ctx if ctx is not None else _mx().cpu()
    for start in range(0, len(images), batch_size):
        x = _to_float(images[start:start + batch_size])
        y = labels[start:start + batch_size].astype(np.float32)
        yield _make_batch(x, y, input_size, ctx)
