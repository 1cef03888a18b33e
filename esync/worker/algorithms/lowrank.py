"""Low-rank deltas on the wire: PowerSGD (Vogels, Karimireddy & Jaggi, NeurIPS 2019) applied to
ESync's round deltas (``--low-rank R``).

Why. On links that cost several iterations per model transfer, ESync either waits for the
exchange or hides it behind long, one-round-late rounds; both cost convergence. A delta matrix
``M`` (rows x cols) travels as two thin factors instead: ``P = M Q`` (rows x R) and
``Q' = M^T P^`` (cols x R), about ``R (rows + cols)`` numbers instead of ``rows * cols``. Both
factors are linear in ``M``, so the parameter server's plain sum still aggregates them:

    P    = sum_i M_i Q              (first exchange; Q is the same on every worker)
    P^   = orthonormal columns of P (every worker computes the same, from the same sum)
    Q'   = sum_i M_i^T P^           (second exchange)
    sum_i M_i  ~  P^ Q'^T           (= P^ P^T sum_i M_i: the sum projected on R directions)

Error feedback keeps what the projection dropped: worker i adds ``e_i = M_i - P^ (M_i^T P^)^T``
to its next round's matrix, so nothing a device computed is lost, only delayed. The next round
starts its power iteration from ``Q'`` (the "warm start"), so one iteration per round tracks the
dominant directions as they drift.

Which arrays. A parameter is viewed as a matrix ``(shape[0], prod(shape[1:]))`` (a convolution's
kernel: output channels x the rest, as in the paper); it is compressed when it is large enough
for the factors to be worth a second exchange (``compressed``). Biases and small arrays travel in
full with the first exchange. ``reference_round`` is the rule in plain numpy (the tests replay
it); ``LowRankWire`` is a worker's side of it in MXNet, used by ``esync.worker.algorithms.esync``.

What is not kept: the residuals and the current Q live in the workers' memory only. A run
resumed from a checkpoint starts them again (zero residuals, the first Q): the directions are
found again within a few rounds, and what the residuals held (less than one round's
projection error) is lost once.
"""
from __future__ import annotations

import math

import numpy as np

MIN_ELEMENTS = 4096      # smaller arrays travel in full: a second exchange for them buys nothing
MAX_FACTOR_SHARE = 0.25  # ... and so do arrays whose factors would be over a quarter of them
Q_SEED = 20191208        # every worker draws the same first Q (NeurIPS 2019's first day)


def matrix_shape(shape) -> tuple[int, int]:
    """The matrix a parameter of ``shape`` is viewed as: (first axis, the rest)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        return (1, math.prod(shape))
    return (shape[0], math.prod(shape[1:]))


def compressed(shape, rank: int) -> bool:
    """Whether a parameter of ``shape`` travels as rank-``rank`` factors."""
    if rank <= 0 or len(shape) < 2:
        return False
    rows, cols = matrix_shape(shape)
    return (rows * cols >= MIN_ELEMENTS and rank <= min(rows, cols)
            and rank * (rows + cols) <= MAX_FACTOR_SHARE * rows * cols)


def initial_q(shape, rank: int, index: int) -> np.ndarray:
    """The first round's Q for parameter ``index``: standard normal, the same on every worker."""
    _, cols = matrix_shape(shape)
    return np.random.RandomState(Q_SEED + index).standard_normal((cols, rank)).astype(np.float32)


def orthonormalize(p: np.ndarray) -> np.ndarray:
    """Orthonormal columns spanning ``p``'s (Householder QR in float64, returned as float32).
    A rank-deficient ``p`` (no worker moved the parameter) still gives orthonormal columns: the
    projection on them is then zero, never NaN."""
    q, _ = np.linalg.qr(np.asarray(p, dtype=np.float64))
    return q.astype(np.float32)


def reference_round(matrices: list, q: np.ndarray):
    """One PowerSGD round on the workers' matrices ``M_i`` (their residuals already added):
    ``(approximate sum, next round's Q, each worker's new residual)``."""
    p_hat = orthonormalize(sum(m @ q for m in matrices))
    own_q = [m.T @ p_hat for m in matrices]
    q_sum = sum(own_q)
    residuals = [m - p_hat @ qi.T for m, qi in zip(matrices, own_q)]
    return p_hat @ q_sum.T, q_sum, residuals


def traffic(shapes, rank: int) -> tuple[int, int]:
    """(numbers a worker pushes per round with rank ``rank``, numbers with full deltas)."""
    full = sum(math.prod(s) for s in shapes)
    sent = 0
    for shape in shapes:
        if compressed(shape, rank):
            rows, cols = matrix_shape(shape)
            sent += rank * (rows + cols)
        else:
            sent += math.prod(shape)
    return sent, full


class LowRankWire:
    """A worker's side of ``--low-rank``: which deltas travel as factors, each one's Q and
    error-feedback residual, and the two exchanges' arrays (MXNet's ``dot`` on the quantities of
    ``reference_round``). Every worker holds the same Q and computes the same orthonormal P^
    from the same pulled sum, so every worker rebuilds the same approximate sum."""

    def __init__(self, shapes, rank: int, ctx):
        from mxnet import nd
        self.nd, self.rank = nd, rank
        self.shapes = [tuple(s) for s in shapes]
        self.indices = [i for i, s in enumerate(self.shapes) if compressed(s, rank)]
        self.q = {i: nd.array(initial_q(self.shapes[i], rank, i), ctx=ctx) for i in self.indices}
        self.residual = {i: nd.zeros(matrix_shape(self.shapes[i]), ctx=ctx)
                         for i in self.indices}
        self.p_sum = {i: nd.zeros((matrix_shape(self.shapes[i])[0], rank), ctx=ctx)
                      for i in self.indices}
        self.q_sum = {i: nd.zeros((matrix_shape(self.shapes[i])[1], rank), ctx=ctx)
                      for i in self.indices}
        self.p_keys = self.q_keys = []
        self._matrix, self._p_hat, self._own_q = {}, {}, {}

    def key_shapes(self) -> list:
        """Shapes of the keys the factors need: every P, then every Q."""
        return ([(matrix_shape(self.shapes[i])[0], self.rank) for i in self.indices]
                + [(matrix_shape(self.shapes[i])[1], self.rank) for i in self.indices])

    def use_keys(self, keys: list) -> None:
        n = len(self.indices)
        self.p_keys, self.q_keys = list(keys[:n]), list(keys[n:2 * n])

    def first(self, pushed: list, outs: list, keys: list, *, push: float = 1.0
              ) -> tuple[list, list, list]:
        """The first exchange: ``pushed`` (this round's pushes, one per parameter; the
        compressed ones still raw deltas, weighted here by ``push`` in the same pass that adds
        the residual) with each compressed one replaced by ``P_i = M_i Q``."""
        arrays, outs, keys = list(pushed), list(outs), list(keys)
        for n, i in enumerate(self.indices):
            delta = pushed[i].reshape(matrix_shape(self.shapes[i]))
            matrix = (delta * push if push != 1 else delta) + self.residual[i]
            self._matrix[i] = matrix
            arrays[i], outs[i], keys[i] = self.nd.dot(matrix, self.q[i]), self.p_sum[i], \
                self.p_keys[n]
        return arrays, outs, keys

    def second(self) -> tuple[list, list, list]:
        """The second exchange, once the P sums are in: ``Q_i = M_i^T P^``."""
        arrays = []
        for i in self.indices:
            p_hat = self.nd.array(orthonormalize(self.p_sum[i].asnumpy()),
                                  ctx=self.p_sum[i].context)
            self._p_hat[i] = p_hat
            self._own_q[i] = self.nd.dot(self._matrix[i], p_hat, transpose_a=True)
            # A copy goes: MXNet's distributed store pulls a key's sum into the array last
            # pushed for it first, and the residual needs this worker's own factor.
            arrays.append(self._own_q[i].copy())
        return arrays, [self.q_sum[i] for i in self.indices], self.q_keys

    def finish(self, sums: list) -> None:
        """Once the Q sums are in: write each approximate sum ``P^ Q^T`` into ``sums`` (the
        full-size sums of the first exchange), keep this worker's residual, warm-start Q."""
        nd = self.nd
        for i in self.indices:
            p_hat, q_sum = self._p_hat[i], self.q_sum[i]
            sums[i][:] = nd.dot(p_hat, q_sum, transpose_b=True).reshape(self.shapes[i])
            self.residual[i] = self._matrix[i] - nd.dot(p_hat, self._own_q[i], transpose_b=True)
            self.q[i] = q_sum.copy()
        self._matrix, self._p_hat, self._own_q = {}, {}, {}
