"""Synchronous SGD (SSGD): every iteration, push gradients, pull their sum, step with lr*sum/N.

As in the original, each worker's gradient is summed over its batch, so one step moves by
``-l`` x (sum over workers of the batch-summed gradients) / N.
"""
from esync.algorithms.base import Algorithm, grads


class SyncSGD(Algorithm):
    kvstore_type = "dist_sync"
    collective_stop = True

    def setup(self) -> None:
        self.trainer = self.sgd(self.args.learning_rate)
        self.grads = grads(self.worker.trainable)

    def aggregate(self, record, want_stop: bool) -> bool:
        w = self.worker
        with record.phase("global aggregate"):
            # Pulling into the gradient buffers leaves the sum over all workers there.
            stop = self.exchange(self.grads, self.grads, w.keys.trainable, want_stop)
        with record.phase("local update"):
            self.trainer.step(w.num_workers)
        return stop
