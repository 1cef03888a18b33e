"""The learning rate keeps the original ESync's meaning: one step is lr x the gradient summed over
the batch (the original backpropagates the per-sample loss vector and calls ``step(1)``).

The cluster modes are checked against the same formula in test_distributed.py (sync, ESync with
one local step, async and DC-ASGD on the server).
"""
import mxnet as mx
import pytest
import numpy as np
from mxnet import autograd, gluon

from esync import cli
from esync.worker import models
from esync.worker.algorithms import AlgorithmConfig, Worker, algorithm_class
from esync.worker.measure import RoundRecord
from esync.worker.trainer import TrainingLoop, _shard, resolve_context

LR, BATCH = 0.01, 8


def summed_gradient_step(net, x, y, lr):
    """w - lr * sum_b grad(loss_b), each per-sample gradient from its own backward pass."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    params = models.named_parameters(net)
    total = {name: np.zeros(p.shape, dtype=np.float64) for name, p in params.items()}
    for b in range(x.shape[0]):
        with autograd.record():
            loss = loss_fn(net(x[b:b + 1]), y[b:b + 1])
        loss.backward()
        for name, p in params.items():
            total[name] += p.grad().asnumpy()
    return {name: p.data().asnumpy() - lr * total[name] for name, p in params.items()}


def local_loop(tmp_path, fashion_data_dir, *flags):
    """(args, its context, the model, the training loop) of one device alone at LR, BATCH."""
    args = cli.parse_args(["-m", "local", "-c", "1", "-n", "lenet", "-dd", str(fashion_data_dir),
                           "-ld", str(tmp_path), "-l", str(LR), "-b", str(BATCH), *flags])
    ctx = resolve_context(args)                # where the worker trains and its batches are
    net = models.build("lenet", ctx, seed=args.seed)
    trainable, aux = models.trainable_and_aux(net)
    worker = Worker(config=AlgorithmConfig.from_args(args), ctx=ctx, net=net,
                    trainable=trainable, aux=aux)
    algo = algorithm_class("local")(worker)
    algo.setup()
    return args, ctx, net, TrainingLoop(worker, algo, _shard(args, 0, 1), None, None, tmp_path,
                                        "cpu0", args)


def test_one_local_step_moves_by_lr_times_the_batch_summed_gradient(tmp_path, fashion_data_dir):
    args, ctx, net, loop = local_loop(tmp_path, fashion_data_dir)

    x, y = _shard(args, 0, 1).next_batch()              # the batch the loop will take first
    want = summed_gradient_step(models.build("lenet", ctx, seed=args.seed), x, y, LR)
    k, _, _ = loop._local_phase(RoundRecord(1), 0.0)

    got = {name: p.data().asnumpy() for name, p in models.named_parameters(net).items()}
    assert k == 1 and all(np.allclose(got[n], want[n], rtol=1e-4, atol=1e-6) for n in want)


def summed_gradient(net, x, y):
    """sum_b grad(loss_b) at the net's weights, by name (one backward of the per-sample loss)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    return {name: p.grad().asnumpy().astype(np.float64)
            for name, p in models.named_parameters(net).items()}


@pytest.mark.parametrize("nesterov", [False, True], ids=["heavy-ball", "nesterov"])
def test_momentum_of_one_device_alone_follows_the_spelled_out_rule(tmp_path, fashion_data_dir,
                                                                   nesterov):
    """-m local --momentum 0.9: v = m v + g; w -= lr v (heavy ball) or w -= lr (g + m v)
    (Nesterov), g the batch-summed gradient, over three steps."""
    momentum = 0.9
    args, ctx, net, loop = local_loop(tmp_path, fashion_data_dir, "--momentum", str(momentum),
                                      *(["--nesterov"] if nesterov else []))

    replay = models.build("lenet", ctx, seed=args.seed)
    params = models.named_parameters(replay)
    velocity = {name: np.zeros(p.shape) for name, p in params.items()}
    batches = _shard(args, 0, 1)
    for _ in range(3):
        x, y = batches.next_batch()
        g = summed_gradient(replay, x, y)
        for name, p in params.items():
            velocity[name] = momentum * velocity[name] + g[name]
            step = g[name] + momentum * velocity[name] if nesterov else velocity[name]
            p.set_data(mx.nd.array(p.data().asnumpy() - LR * step, ctx=ctx))
        loop._local_phase(RoundRecord(1), 0.0)

    got = {name: p.data().asnumpy() for name, p in models.named_parameters(net).items()}
    want = {name: p.data().asnumpy() for name, p in params.items()}
    assert all(np.allclose(got[n], want[n], rtol=1e-4, atol=1e-5) for n in want)
    plain = models.build("lenet", ctx, seed=args.seed)          # momentum did move it elsewhere
    assert not all(np.allclose(got[n], p.data().asnumpy(), atol=1e-3)
                   for n, p in models.named_parameters(plain).items())


def test_the_servers_optimizer_carries_the_momentum_in_async_modes():
    from esync.worker.algorithms.base import sgd_optimizer
    assert sgd_optimizer(0.01) == ("sgd", {"learning_rate": 0.01})
    assert sgd_optimizer(0.01, 0.9) == ("sgd", {"learning_rate": 0.01, "momentum": 0.9})
    assert sgd_optimizer(0.01, 0.9, True) == ("nag", {"learning_rate": 0.01, "momentum": 0.9})
    for dcasgd, kind in ((0, mx.optimizer.NAG), (1, mx.optimizer.NAG)):
        args = cli.parse_args(["-m", "async", "-dcasgd", str(dcasgd), "-l", "0.01",
                               "--momentum", "0.9", "--nesterov"])
        worker = Worker(config=AlgorithmConfig.from_args(args), ctx=mx.cpu(), net=None,
                        trainable=[], aux=[])
        optimizer = algorithm_class("async", dcasgd)(worker).optimizer()
        assert isinstance(optimizer, kind) and optimizer.momentum == 0.9
