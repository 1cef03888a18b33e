"""Shared pytest fixtures; each block belongs to the part of the project named in its comment."""
from pathlib import Path

import numpy as np
import pytest


# data fixtures ---------------------------------------------------------------------------------
# Small, learnable stand-ins for Fashion-MNIST written as real IDX files (esync.data reads them).


def make_fashion_arrays(per_class, seed=0):
    """(uint8 images [10*per_class, 28, 28], uint8 labels), classes shuffled together.

    Class c has a bright bar on rows 2c+2..2c+3 over dim noise, so a small CNN learns it fast.
    """
    rng = np.random.RandomState(seed)
    labels = np.repeat(np.arange(10, dtype=np.uint8), per_class)
    rng.shuffle(labels)
    images = rng.randint(0, 60, size=(len(labels), 28, 28)).astype(np.uint8)
    for c in range(10):
        images[labels == c, 2 * c + 2:2 * c + 4, 4:24] = 255
    return images, labels


def write_fashion_dir(data_dir, *, train_per_class=20, test_per_class=10, seed=0):
    """Write the four Fashion-MNIST IDX files in ``<data_dir>/fashion-mnist/``; return data_dir."""
    from esync.data import FASHION_FILES, write_idx

    folder = Path(data_dir) / "fashion-mnist"
    folder.mkdir(parents=True, exist_ok=True)
    for offset, (split, per_class) in enumerate((("train", train_per_class),
                                                  ("test", test_per_class))):
        images, labels = make_fashion_arrays(per_class, seed=seed + offset)
        image_name, label_name = FASHION_FILES[split]
        write_idx(folder / image_name, images)
        write_idx(folder / label_name, labels)
    return Path(data_dir)


@pytest.fixture
def fashion_data_dir(tmp_path):
    """A data_dir holding a small Fashion-MNIST stand-in: 200 train and 100 test images."""
    return write_fashion_dir(tmp_path / "data")


@pytest.fixture
def fashion_dir_factory(tmp_path):
    """``make(name="data", train_per_class=20, test_per_class=10, seed=0) -> data_dir``."""
    def make(name="data", **kwargs):
        return write_fashion_dir(tmp_path / name, **kwargs)

    return make

# end of data fixtures --------------------------------------------------------------------------
