"""Asynchronous SGD (ASGD) and DC-ASGD: the server applies the optimizer to each push at once.

Workers push gradients and pull the current weights without ever waiting for each other. With
``-dcasgd 1`` the server runs MXNet's delay-compensated optimizer (Zheng et al., ICML 2017),
which corrects a stale gradient with a cheap approximation of the Hessian.
As in the original, the pushed gradient is summed over the batch and the server's optimizer does
not rescale it: each update is ``-l`` x the batch's summed gradient.
Batch-norm running statistics stay local in these modes (the server would treat them as
gradients); rank 0's statistics go into the checkpoints.
"""
import mxnet as mx

from esync.worker.algorithms.base import Algorithm, datas, grads

DCASGD_LAMBDA = 0.04     # MXNet's default variance-control factor, as the original uses it


class AsyncSGD(Algorithm):
    kvstore_type = "dist_async"

    def optimizer(self) -> mx.optimizer.Optimizer:
        return mx.optimizer.SGD(learning_rate=self.config.learning_rate)

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
    def optimizer(self) -> mx.optimizer.Optimizer:
        return mx.optimizer.DCASGD(learning_rate=self.config.learning_rate, lamda=DCASGD_LAMBDA)
