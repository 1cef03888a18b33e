"""What a run can name: the networks, the data's files. Read by the worker, the launcher and the
benchmark alike, so that the last two never import the worker (which builds the networks with
MXNet and reads the files with numpy).

A new network is one line here (its input size) plus its builder in ``esync.worker.models``; the
data splits (``-s``) are ``esync.common.modes.SPLITS``.
"""

# The networks by the original ESync's names (-n), each with the side of the square image it
# takes: 28 for the ResNets (the model zoo's ``thumbnail`` stem), the MobileNets and lenet,
# 224 for AlexNet and 299 for Inception-v3, as in the original.
NETWORKS = {
    "lenet": 28,
    "alexnet": 224,
    "resnet18-v1": 28,
    "resnet50-v1": 28,
    "resnet50-v2": 28,
    "mobilenet-v1": 28,
    "mobilenet-v2": 28,
    "inception-v3": 299,
}

# Fashion-MNIST: ten classes of 28x28 images, in four IDX files under <data_dir>/fashion-mnist/.
NUM_CLASSES = 10
IMAGE_SIZE = 28
FASHION_SUBDIR = "fashion-mnist"
FASHION_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
ALL_FASHION_FILES = FASHION_FILES["train"] + FASHION_FILES["test"]
