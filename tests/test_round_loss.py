"""A round's logged training loss is the mean over the iterations in its delta: its own and
those carried into it through the previous exchange (``--carry``). A round made only of carried
iterations (the slowest device under ``--carry-slowest``) used to log 0.0."""
from esync.worker.measure import RoundRecord
from esync.worker.trainer import TrainingLoop


class RoundOf:
    """The algorithm's side of the local phase: ``own`` iterations, then ready."""

    def __init__(self, own):
        self.own = own

    def continue_local(self, k, last_c, record):
        return k < self.own


def loop_with(losses, own):
    loop = TrainingLoop.__new__(TrainingLoop)        # only what the local phase reads
    loop.algo, loop.carried_losses = RoundOf(own), []
    pending = iter(losses)

    def iteration(record):
        record.add("forward and backward", 0.01)
        return next(pending), 0.01
    loop._iteration = iteration
    return loop


def record():
    return RoundRecord(1, settle=lambda: None)


def test_a_round_of_carried_iterations_only_logs_their_mean_loss():
    loop = loop_with([3.0, 5.0], own=0)
    rec = record()
    assert [loop._carried_iteration(rec) for _ in range(2)] == [0.01, 0.01]
    k, _, loss = loop._local_phase(record(), 0.0)
    assert (k, loss) == (0, 4.0)
    assert loop.carried_losses == []                 # counted once, in this round only


def test_carried_and_own_iterations_weigh_alike():
    loop = loop_with([2.0, 1.0, 1.0, 8.0], own=3)
    loop._carried_iteration(record())
    k, _, loss = loop._local_phase(record(), 0.0)
    assert (k, loss) == (3, 3.0)                     # (2 + 1 + 1 + 8) / 4
    k, _, loss = loop_with([6.0, 2.0], own=2)._local_phase(record(), 0.0)
    assert (k, loss) == (2, 4.0)                     # nothing carried: the own mean, as before
