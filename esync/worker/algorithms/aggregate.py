"""ESync's aggregation rules: how the workers' model deltas of a round become the next model.

Pure functions on arrays: numpy arrays or MXNet NDArrays alike (only ``+ - * /`` are used),
no KVStore in here; only ``OuterOptimizer.update``, the worker's fused form of the outer step,
needs NDArrays. Notation, for one parameter of N workers: ``start`` is the model every worker
began the round from, ``delta_i = params_i - start`` what worker i's ``k_i`` local steps did,
``gl`` the global learning rate (``-gl``).

Rules (``--aggregation``):

``mean``
    The original ESync (Li et al., "ESync: An Efficient Synchronous Parallel Algorithm for
    Distributed ML in Heterogeneous Clusters"): ``start + gl * (1/N) * sum_i delta_i``. With
    unequal ``k_i`` a round is worth about ``mean(k)`` local steps although the fast workers
    did more.
``weighted``
    Deltas weighted by the work behind them: ``start + gl * sum_i w_i delta_i / sum_i w_i`` with
    ``w_i = k_i`` (equal batch sizes make this the same as weighting by samples). A delta
    already grows with its ``k_i``, so worker i's *objective* is weighted by ``k_i ** 2``
    (FedNova's analysis): the right rule for i.i.d. shards, a biased one for by-class shards.
``fednova``
    Normalised averaging (Wang et al., "Tackling the Objective Inconsistency Problem in
    Heterogeneous Federated Optimization", NeurIPS 2020): each delta divided by its own step
    count, the average rescaled by the effective step count,
    ``start + gl * (sum_i p_i k_i) * sum_i p_i (delta_i / k_i)`` with ``p_i`` the worker's share
    of the data (``1/N`` for the equal shards of ``esync.common.dataset.partition``). On non-i.i.d. data it
    removes the bias towards the objectives of the workers that ran more steps.
``sum``
    Every delta applied in full: ``start + gl * sum_i delta_i``, as ASGD applies every gradient
    it receives (``mean`` with ``gl`` times N). Objective i is weighted by ``k_i``, as in
    ``mean``, but a round moves the model as far as all the local steps together: on by-class
    shards the plain mean's step is N times smaller than ASGD's at the same rate, and learns
    the classes of the slow devices too slowly.

With every ``k_i`` equal, ``mean``, ``weighted`` and ``fednova`` give the same model (``sum``: the
same step, N times longer).

The distributed form: the parameter server only sums. Worker i pushes
``push_weight(rule, k_i) * delta_i``; with every ``k_j`` known from the control vector of the same
exchange, ``sum_weight(rule, ks) * pulled_sum`` is the rule's aggregated delta (no extra round
trip).

Outer optimizer (``--outer-momentum M``, ``--nesterov``): the aggregated delta is treated as a
(negative) pseudo-gradient and momentum is applied to it, as DiLoCo does (Douillard et al.,
"DiLoCo: Distributed Low-Communication Training of Language Models", 2023: Nesterov momentum 0.9,
outer learning rate 0.7)::

    buffer <- M * buffer + delta
    step   <- delta + M * buffer      (Nesterov)      or      buffer      (heavy ball)
    params <- start + gl * step

With ``M = 0`` the step is the delta itself: the rule alone. Every worker computes the same step
from the same pulled sums, so the buffer is identical on every worker; it goes into checkpoints.

Adam as the outer optimizer (``--outer-adam``; FedAdam, Reddi et al., "Adaptive Federated
Optimization", ICLR 2021): the pseudo-gradient ``g = -delta`` feeds Adam's two moments, and every
coordinate moves by about ``gl`` or less, whatever the size of its delta::

    mean     <- M * mean + (1 - M) * g                 (M: --outer-momentum, Adam's beta1)
    variance <- B2 * variance + (1 - B2) * g * g       (B2: --outer-beta2)
    params   <- start - gl * mean / (sqrt(variance) + tau)      (tau: --outer-epsilon)

No bias correction, as FedAdam. On shuffled class shards the rounds' deltas pull towards
different devices' classes from one round to the next; the normalised step keeps one round's
pull from dominating the model (docs/ALGORITHM.md, "Adam as the outer step").
"""
from __future__ import annotations

from dataclasses import dataclass

from esync.common.modes import AGGREGATION_RULES as RULES


class AggregationError(ValueError):
    pass


def _check(deltas, weights=None) -> None:
    if not deltas:
        raise AggregationError("no deltas to aggregate")
    if weights is not None and len(weights) != len(deltas):
        raise AggregationError(f"{len(weights)} weights for {len(deltas)} deltas")


def mean(start, deltas, global_lr: float = 1.0):
    """``start + gl * (1/N) * sum_i delta_i`` (the original ESync)."""
    _check(deltas)
    return start + global_lr * _total(deltas) / len(deltas)


def total(start, deltas, global_lr: float = 1.0):
    """``start + gl * sum_i delta_i`` (every delta in full, as ASGD applies every gradient)."""
    _check(deltas)
    return start + global_lr * _total(deltas)


def weighted(start, deltas, weights, global_lr: float = 1.0):
    """``start + gl * sum_i w_i delta_i / sum_i w_i`` (weights: each worker's k_i or samples)."""
    _check(deltas, weights)
    total_weight = float(sum(weights))
    if total_weight <= 0:
        raise AggregationError(f"weights must sum to a positive number, got {list(weights)}")
    return start + global_lr * _total([w * d for w, d in zip(weights, deltas)]) / total_weight


def fednova(start, deltas, ks, global_lr: float = 1.0, shares=None):
    """``start + gl * (sum_i p_i k_i) * sum_i p_i (delta_i / k_i)`` (FedNova, Wang et al. 2020).

    ``shares`` are the ``p_i`` (each worker's fraction of the data); default ``1/N`` each.
    """
    _check(deltas, ks)
    if any(k <= 0 for k in ks):
        raise AggregationError(f"fednova needs every k_i >= 1, got {list(ks)}")
    p = [1.0 / len(deltas)] * len(deltas) if shares is None else list(shares)
    _check(deltas, p)
    effective_steps = sum(pi * k for pi, k in zip(p, ks))
    normalised = _total([(pi / k) * d for pi, k, d in zip(p, ks, deltas)])
    return start + global_lr * effective_steps * normalised


def aggregate(rule: str, start, deltas, ks, global_lr: float = 1.0):
    """The rule by name, with the weights ESync uses (``weighted``: w_i = k_i; ``fednova``: 1/N)."""
    if rule == "mean":
        return mean(start, deltas, global_lr)
    if rule == "weighted":
        return weighted(start, deltas, ks, global_lr)
    if rule == "fednova":
        return fednova(start, deltas, ks, global_lr)
    if rule == "sum":
        return total(start, deltas, global_lr)
    raise AggregationError(f"unknown aggregation rule {rule!r}; choose one of: {', '.join(RULES)}")


# -- the distributed form: what each worker pushes, and how the pulled sum is scaled ----------------

def push_weight(rule: str, k_i: int) -> float:
    """Factor worker i applies to its delta before pushing it (the server sums the pushes)."""
    if rule in ("mean", "sum"):
        return 1.0
    if rule == "weighted":
        return float(k_i)
    if rule == "fednova":
        return 1.0 / k_i
    raise AggregationError(f"unknown aggregation rule {rule!r}; choose one of: {', '.join(RULES)}")


def sum_weight(rule: str, ks) -> float:
    """Factor that turns the pulled sum of pushes into the rule's aggregated delta."""
    n = len(ks)
    if rule == "mean":
        return 1.0 / n
    if rule == "weighted":
        return 1.0 / float(sum(ks))
    if rule == "fednova":
        return (sum(ks) / n) / n          # effective steps sum(p_i k_i), times p_i = 1/N
    if rule == "sum":
        return 1.0
    raise AggregationError(f"unknown aggregation rule {rule!r}; choose one of: {', '.join(RULES)}")


def variate_weight(rule: str, k_i: int) -> float:
    """SCAFFOLD: the weight of worker i's variate ``c_i`` in the global one, ``c = sum_i v_i c_i /
    sum_i v_i``, with ``v_i = push_weight * k_i``: a round's constant correction ``c - c_i`` moves
    worker i's delta by ``-lr k_i (c - c_i)``, and the rule takes that delta with a factor
    proportional to ``push_weight``; with these weights the corrections cancel in the aggregated
    step (``mean``, ``sum``: ``k_i``; ``weighted``: ``k_i ** 2``; ``fednova``: 1, the published
    plain mean, as with every ``k_i`` equal)."""
    return push_weight(rule, k_i) * k_i


def global_variate(rule: str, variates, ks):
    """SCAFFOLD's ``c`` from the workers' ``c_i`` and their round's ``k_i`` (``variate_weight``)."""
    _check(variates, ks)
    weights = [variate_weight(rule, k) for k in ks]
    if sum(weights) <= 0:
        raise AggregationError(f"no worker ran a step: k = {list(ks)}")
    return _total([w * c for w, c in zip(weights, variates)]) / float(sum(weights))


# -- the outer optimizer ---------------------------------------------------------------------------

@dataclass(frozen=True)
class OuterOptimizer:
    """Momentum (``nesterov=False``) or Nesterov momentum on the aggregated delta; 0: none.
    ``adam``: Adam instead, ``momentum`` its first moment's decay (module docstring)."""

    momentum: float = 0.0
    nesterov: bool = False
    adam: bool = False
    beta2: float = 0.99
    epsilon: float = 1e-3

    @property
    def has_state(self) -> bool:
        return self.momentum > 0 or self.adam

    @property
    def scaled_state(self) -> bool:
        """The fused kernels keep the momentum as ``gl * buffer`` (``velocity_from``); Adam's
        moments and no state need no conversion."""
        return self.momentum > 0 and not self.adam

    def step(self, delta, buffer):
        """``(step, new_buffer)`` for one parameter; ``buffer`` is None when there is no state
        and ``(mean, variance)`` under Adam. ``apply_step(start, step, gl)`` is the new model."""
        if self.adam:
            mean, variance = buffer
            g = -delta
            mean = self.momentum * mean + (1 - self.momentum) * g
            variance = self.beta2 * variance + (1 - self.beta2) * g * g
            return -mean / (variance ** 0.5 + self.epsilon), (mean, variance)
        if not self.has_state:
            return delta, buffer
        new_buffer = self.momentum * buffer + delta
        if self.nesterov:
            return delta + self.momentum * new_buffer, new_buffer
        return new_buffer, new_buffer

    def update(self, start, total, velocity, *, scale: float = 1.0,
               global_lr: float = 1.0, variance=None) -> None:
        """The worker's outer step, in place on MXNet NDArrays: ``start <- apply_step(start,
        step(scale * total), gl)`` as one of MXNet's fused optimizer kernels (``sgd_update``,
        ``sgd_mom_update``, ``nag_mom_update``, with the rate negated: they step against a
        gradient, this along a delta). One pass over the model where the arithmetic spelled
        out took seven: on a device capped at a sixteenth of a core that was about 48 ms of a
        0.52 s round, fused about 15 ms (timed at full speed, times sixteen).

        ``velocity`` is the kernels' momentum state, ``gl * buffer`` (``velocity_from`` and
        ``buffer_from`` convert; checkpoints keep the buffer), None without momentum. Equal to
        ``step`` and ``apply_step`` up to float32 rounding (the products are ordered
        differently).

        Under Adam ``velocity`` is its mean and ``variance`` its second moment, both of the
        pseudo-gradient ``-scale * total`` (``adam_update``, kept as they are)."""
        from mxnet import nd
        if self.adam:
            nd.adam_update(start, total, velocity, variance, lr=global_lr, beta1=self.momentum,
                           beta2=self.beta2, epsilon=self.epsilon, wd=0.0,
                           rescale_grad=-scale, out=start)
            return
        rate = dict(lr=-global_lr, wd=0.0, rescale_grad=scale)
        if not self.has_state:
            nd.sgd_update(start, total, out=start, **rate)
        elif self.nesterov:      # v <- m v + gl d;  start <- start + m v + gl d
            nd.nag_mom_update(start, total, velocity, momentum=self.momentum, out=start, **rate)
        else:                    # v <- m v + gl d;  start <- start + v
            nd.sgd_mom_update(start, total, velocity, momentum=self.momentum, out=start, **rate)

    @staticmethod
    def velocity_from(buffer, global_lr: float):
        """The kernels' state for a buffer (in place): ``gl * buffer``."""
        buffer *= global_lr
        return buffer

    @staticmethod
    def buffer_from(velocity, global_lr: float):
        """The buffer (a new array) for the kernels' state: ``velocity / gl``."""
        return velocity / global_lr


def apply_step(start, step, global_lr: float = 1.0):
    """``start + gl * step``: the next global model."""
    return start + global_lr * step


def _total(arrays):
    total = arrays[0]
    for a in arrays[1:]:
        total = total + a
    return total
