"""Asynchronous SGD (ASGD) and DC-ASGD: the server applies each push at once, nobody waits.

As in the original, the pushed gradient is summed over the batch and the server's optimizer does
not rescale it: each update is ``-l`` x the batch's summed gradient.
Batch-norm running statistics stay local in these modes (the server would treat them as
gradients); rank 0's statistics go into the checkpoints.

DC-ASGD (Zheng et al., "Asynchronous Stochastic Gradient Descent with Delay Compensation",
ICML 2017) corrects worker m's stale gradient ``g``, computed on the model ``w_bak(m)`` it last
pulled, with a cheap approximation of the Hessian::

    g + lambda * g * g * (w_now - w_bak(m))        (elementwise)

``-dcasgd 1`` (``DCASGD``) is that rule. The server only runs plain SGD; the worker, which alone
knows which model its gradient belongs to, keeps ``w_bak`` (its local weights: the ones it last
pulled), pulls ``w_now`` before pushing, compensates, pushes, and keeps the weights the push
pulls back as its next ``w_bak``. Cost: one extra pull of the whole model per step (2 pulls and
1 push of the model instead of 1 and 1: 1.5x the bytes) and one more round trip. With one worker
``w_now == w_bak`` at every step, so it is exactly plain SGD whatever lambda.

``-dcasgd 2`` (``MXNetDCASGD``) is MXNet's ``DCASGD`` optimizer on the server, as the original
ESync code uses it. The server does not know which worker pushed, so it keeps one previous weight
per key, overwritten by every update: it compensates with ``w_now - w_prev``, the last update of
any worker, not with the model the gradient was computed on. A gradient that is several updates
stale is corrected for one of them, and even one worker alone is not plain SGD.

lambda (``--dcasgd-lambda``, default ``DCASGD_LAMBDA``, both variants) multiplies ``g * g`` of
the batch-*summed* gradient: with batch size B, ``g = B * g_mean``, so the step
``lr * (g + lambda g^2 dw)`` is ``lr B (g_mean + lambda B g_mean^2 dw)``. The paper defines
lambda on the mean gradient, so this lambda is the paper's divided by B: 0.04 with ``-b 64`` is
the paper's lambda = 2.56.
"""
import mxnet as mx
from mxnet import nd

from esync.worker.algorithms.base import Algorithm, datas, grads, sgd_optimizer

DCASGD_LAMBDA = 0.04     # --dcasgd-lambda's default: MXNet's, as the original uses it


class AsyncSGD(Algorithm):
    kvstore_type = "dist_async"

    def optimizer(self) -> mx.optimizer.Optimizer:
        """The server's optimizer: SGD, with ``--momentum`` (``--nesterov``) applied to every
        gradient as it arrives (DC-ASGD: to the compensated gradient, Zheng et al.'s
        DC-ASGD with momentum)."""
        c = self.config
        name, params = sgd_optimizer(c.learning_rate, c.momentum, c.nesterov)
        return mx.optimizer.create(name, **params)

    def prepare(self) -> None:
        # Every worker registers the optimizer before init, whose barrier then guarantees the
        # server's updater is in place before the first push.
        self.worker.channel.kv.set_optimizer(self.optimizer())

    def setup(self) -> None:
        self.grads = grads(self.worker.trainable)
        self.weights = datas(self.worker.trainable)

    def aggregate(self, record, want_stop: bool) -> bool:
        with record.phase("global aggregate"):
            self.worker.channel.push_pull(self.worker.keys.trainable, self.grads, self.weights)
        return want_stop


class DCASGD(AsyncSGD):
    """DC-ASGD as published: compensated at the worker against the model it computed ``g`` on;
    the server runs plain SGD on the compensated gradients (module docstring)."""

    def setup(self) -> None:
        super().setup()
        self.lamda = self.config.dcasgd_lambda
        self.now = [nd.zeros_like(x) for x in self.weights]
        self.compensated = [nd.zeros_like(x) for x in self.weights]

    def aggregate(self, record, want_stop: bool) -> bool:
        with record.phase("global aggregate"):
            self._compensate_and_push()
        return want_stop

    def _compensate_and_push(self) -> None:
        w = self.worker
        # self.weights is w_bak: the gradient was computed on it, it is what we last pulled.
        w.channel.pull(w.keys.trainable, self.now)
        for g, now, bak, out in zip(self.grads, self.now, self.weights, self.compensated):
            out[:] = g + self.lamda * g * g * (now - bak)
        self.dump("dcasgd", w.round_no, grad=self.grads, w_bak=self.weights, w_now=self.now,
                  pushed=self.compensated)
        w.channel.push_pull(w.keys.trainable, self.compensated, self.weights)   # next w_bak


class MXNetDCASGD(AsyncSGD):
    """MXNet's server-side DCASGD (``-dcasgd 2``): one previous weight per key, whoever pushed."""

    def optimizer(self) -> mx.optimizer.Optimizer:
        return mx.optimizer.DCASGD(learning_rate=self.config.learning_rate,
                                   momentum=self.config.momentum,
                                   lamda=self.config.dcasgd_lambda)
