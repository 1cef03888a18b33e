"""The model zoo by the original ESync's names, built for 1-channel 10-class Fashion-MNIST.

The names and input sizes are the catalog's (``esync.common.catalog.NETWORKS``, which the
launcher and the benchmark read without this module); here is how each is built. The ResNets
use the model zoo's ``thumbnail`` stem, a 3x3 convolution without max-pooling, made for small
images. ``lenet`` is a small CNN for CPU experiments and tests (about 20 ms for a batch of 64 on
one core).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from esync.common import catalog
from esync.common.catalog import NUM_CLASSES
from esync.common.errors import UserError

# MXNet is imported where a network is built, not here: importing it costs 1.5 s of CPU.


def _lenet(classes: int):
    from mxnet.gluon import nn
    net = nn.HybridSequential(prefix="lenet_")
    with net.name_scope():
        net.add(nn.Conv2D(20, kernel_size=5, activation="relu"),
                nn.MaxPool2D(pool_size=2, strides=2),
                nn.Conv2D(50, kernel_size=5, activation="relu"),
                nn.MaxPool2D(pool_size=2, strides=2),
                nn.Flatten(),
                nn.Dense(500, activation="relu"),
                nn.Dense(classes))
    return net


def _zoo(name: str, **options) -> Callable[[int], object]:
    """A builder of the Gluon model zoo's network `name` with `classes` outputs."""
    def build(classes: int):
        from mxnet.gluon.model_zoo import vision
        return getattr(vision, name)(classes=classes, **options)
    return build


@dataclass(frozen=True)
class NetworkSpec:
    build: Callable[[int], object]     # classes -> an uninitialised gluon.HybridBlock
    input_size: int


_BUILDERS = {
    "lenet": _lenet,
    "alexnet": _zoo("alexnet"),
    "resnet18-v1": _zoo("resnet18_v1", thumbnail=True),
    "resnet50-v1": _zoo("resnet50_v1", thumbnail=True),
    "resnet50-v2": _zoo("resnet50_v2", thumbnail=True),
    "mobilenet-v1": _zoo("mobilenet1_0"),
    "mobilenet-v2": _zoo("mobilenet_v2_1_0"),
    "inception-v3": _zoo("inception_v3"),
}
# Every network of the catalog (its names and input sizes), with its builder.
NETWORKS = {name: NetworkSpec(_BUILDERS[name], size) for name, size in catalog.NETWORKS.items()}


class UnknownNetworkError(UserError, ValueError):
    pass


def input_size(name: str) -> int:
    return _spec(name).input_size


def _spec(name: str) -> NetworkSpec:
    try:
        return NETWORKS[name]
    except KeyError:
        raise UnknownNetworkError(
            f"unknown network {name!r}; choose one of: {', '.join(NETWORKS)}") from None


def build(name: str, ctx, *, seed: int = 1, hybridize: bool = True):
    """Build, initialise (Xavier, seeded) and shape-infer network `name` on `ctx`.

    A forward pass on one dummy image fixes every deferred shape, so parameters can be pushed to
    the parameter server right away.
    """
    import mxnet as mx
    spec = _spec(name)
    mx.random.seed(seed)
    net = spec.build(NUM_CLASSES)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    if hybridize:
        net.hybridize(static_alloc=True)
    net(mx.nd.zeros((1, 1, spec.input_size, spec.input_size), ctx=ctx))
    # That inference pass may leave weights in MKL-DNN's internal layout, which the distributed
    # KVStore cannot send ("Check failed: !IsMKLDNNData()"): store plain copies.
    for param in net.collect_params().values():
        param.set_data(param.data().copy())
    return net


def named_parameters(net) -> dict:
    """Parameters by structural name (``features.0.weight``), independent of name counters.

    The order is the network's own, identical in every process that builds the same network,
    which makes it a stable key order for the parameter server and for checkpoints.
    """
    return dict(net._collect_params_with_prefix())


def trainable_and_aux(net):
    """Split parameters into trainable ones and auxiliary states (batch-norm running statistics)."""
    params = list(named_parameters(net).values())
    return ([p for p in params if p.grad_req != "null"],
            [p for p in params if p.grad_req == "null"])
