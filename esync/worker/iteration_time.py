"""One device's iteration time and model size, measured on this machine.

    python -m esync.worker.iteration_time lenet 64 [TIMED]     # prints one JSON line

The shaped-link rate (``esync.emulation.shaping``) is matched to these: the emulation starts this
module in a subprocess with one compute thread, like a worker, so that it never imports MXNet
itself.
"""
from __future__ import annotations

import json
import sys
import time

WARMUP, TIMED = 5, 30


def measure(network: str, batch_size: int, timed: int = TIMED) -> dict:
    """``{"model_bytes", "compute_s", "fastest_s"}`` of one device here: the median and the
    fastest of the timed iterations (the fastest is the device's own speed where other work
    shares the machine)."""
    import mxnet as mx
    from mxnet import autograd, gluon

    from esync.worker import models
    net = models.build(network, mx.cpu(), seed=0)
    trainable, _ = models.trainable_and_aux(net)
    model_bytes = sum(int(p.data().size) * 4 for p in trainable)
    size = models.input_size(network)
    x = mx.nd.random.uniform(shape=(batch_size, 1, size, size))
    y = mx.nd.array([i % 10 for i in range(batch_size)])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-4})
    times = []
    for i in range(WARMUP + timed):
        start = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(1)
        mx.nd.waitall()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    times.sort()
    return {"model_bytes": model_bytes, "compute_s": times[len(times) // 2],
            "fastest_s": times[0]}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], int(sys.argv[2]),
                             *(int(n) for n in sys.argv[3:4]))))
