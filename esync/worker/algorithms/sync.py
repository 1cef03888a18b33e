"""Synchronous SGD (SSGD): every iteration, push gradients, pull their sum, step with lr*sum/N.

As in the original, each worker's gradient is summed over its batch, so one step moves by
``-l`` x (sum over workers of the batch-summed gradients) / N. Batch-norm running statistics
are averaged over the workers in the same exchange, every iteration (as the original does), so
every worker, and the checkpoints, hold the mean of the workers' statistics.
"""
from mxnet import nd

from esync.worker.algorithms.base import Algorithm, datas, grads


class SyncSGD(Algorithm):
    kvstore_type = "dist_sync"
    collective_stop = True

    def setup(self) -> None:
        # Every worker applies the same summed gradient: the momentum is the same on each.
        self.trainer = self.baseline_sgd()
        self.grads = grads(self.worker.trainable)
        self.aux = datas(self.worker.aux)
        self.aux_sum = [nd.zeros_like(x) for x in self.aux]

    def aggregate(self, record, want_stop: bool) -> bool:
        with record.phase("global aggregate"):
            stop = self._sum_gradients(want_stop)
        with record.phase("local update"):
            self.trainer.step(self.worker.num_workers)
        return stop

    def _sum_gradients(self, want_stop: bool) -> bool:
        """Pulling into the gradient buffers leaves the sum over all workers there; the
        batch-norm statistics become their mean. Returns the stop vote's outcome."""
        w = self.worker
        stop = self.exchange(self.grads + self.aux, self.grads + self.aux_sum,
                             w.keys.trainable + w.keys.aux, want_stop).stop
        for p, total in zip(w.aux, self.aux_sum):
            p.set_data(total / w.num_workers)
        return stop
