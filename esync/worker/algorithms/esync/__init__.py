"""ESync (Li et al., "ESync: An Efficient Synchronous Parallel Algorithm for Distributed ML in
Heterogeneous Clusters"): every device computes for the whole round.

Each round a worker runs ``k_i`` local steps, then all workers aggregate their model deltas
through the parameter server and move the global model by them; batch-norm statistics are
averaged. ``ESync`` (``algorithm``) is composed of five parts, one module each, one class per
choice behind a small interface, chosen by the flags through ``esync.common.esync_parts`` (which
also declares what cannot be combined):

    sizing.py       round sizing: who decides k_i (the state server's dynamic answers, its
                    plan, or a fixed --local-iters); reporter.py: rank 0's reports to the plan
    local_rule.py   local rule: SGD (with FedProx's term, and SCAFFOLD's correction from
                    scaffold.py) or gradients accumulated at the round's model
    wire.py         what the deltas travel as: float32, float16, or low-rank factors
    schedule.py     when the exchange runs: blocking, carried through, or overlapped
    outer.py        the outer step's buffers (the maths: esync.worker.algorithms.aggregate)

``exchange.py`` holds what every schedule does alike: send a round's delta, receive the sums,
move the global model, start the next round.
"""
from esync.worker.algorithms.esync.algorithm import ESync
from esync.worker.algorithms.esync.outer import MOMENTUM_STATE, VARIANCE_STATE
from esync.worker.algorithms.esync.scaffold import SCAFFOLD_STATE
from esync.worker.algorithms.esync.schedule import carries

__all__ = ["ESync", "MOMENTUM_STATE", "VARIANCE_STATE", "SCAFFOLD_STATE", "carries"]
