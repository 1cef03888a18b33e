"""Standalone SGD on one device: the accuracy reference ("standalone" line of the figures)."""
from esync.worker.algorithms.base import Algorithm


class Standalone(Algorithm):
    def setup(self) -> None:
        self.trainer = self.baseline_sgd()

    def local_step(self, record) -> None:
        with record.phase("local update"):
            self.trainer.step(1)      # lr x the gradient summed over the batch (the original's)
