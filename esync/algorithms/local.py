"""Standalone SGD on one device: the accuracy reference ("standalone" line of the figures)."""
from esync.algorithms.base import Algorithm


class Standalone(Algorithm):
    def setup(self) -> None:
        self.trainer = self.sgd(self.args.learning_rate)

    def local_step(self, record, batch_size: int) -> None:
        with record.phase("local update"):
            self.trainer.step(batch_size)
