"""Synchronous SGD (SSGD): every iteration, push gradients, pull their sum, step with lr*sum/N."""
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
            # Gradients are sums over the batch; pulling into the gradient buffers leaves the
            # sum over all workers there, and step(B*N) divides it back to a mean.
            stop = self.exchange(self.grads, self.grads, w.keys.trainable, want_stop)
        with record.phase("local update"):
            self.trainer.step(self.args.batch_size * w.num_workers)
        return stop
