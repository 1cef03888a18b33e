"""--low-rank: PowerSGD's factors of ESync's deltas, the pure rule and a worker's MXNet side."""
import math

import mxnet as mx
import numpy as np
import pytest

from esync.worker import models
from esync.worker.algorithms import lowrank

LENET_SHAPES = [p.shape for p in models.trainable_and_aux(models.build("lenet", mx.cpu(),
                                                                        seed=1))[0]]


def test_only_the_large_lenet_matrices_travel_as_factors():
    """conv2's kernel (50 x 500) and the first dense layer (500 x 800) are 98% of lenet's
    numbers; the biases, conv1's 500-number kernel and the 10 x 500 output layer (its rank-4
    factors would be 41% of it) travel in full."""
    chosen = {s for s in LENET_SHAPES if lowrank.compressed(s, 4)}
    assert chosen == {(50, 20, 5, 5), (500, 800)}
    assert lowrank.matrix_shape((50, 20, 5, 5)) == (50, 500)
    sent, full = lowrank.traffic(LENET_SHAPES, 4)
    assert full == sum(math.prod(s) for s in LENET_SHAPES)
    assert sent == 4 * (50 + 500) + 4 * (500 + 800) + (full - 50 * 500 - 500 * 800)
    assert sent / full < 0.04
    assert not lowrank.compressed((500, 800), 0)
    assert not lowrank.compressed((500,), 4)
    assert not lowrank.compressed((500, 800), 501)      # a rank above the smaller side


def test_orthonormalize_gives_orthonormal_columns_even_without_movement():
    rng = np.random.RandomState(0)
    p = rng.standard_normal((50, 3)).astype(np.float32)
    q = lowrank.orthonormalize(p)
    assert np.allclose(q.T @ q, np.eye(3), atol=1e-5)
    # the same span: projecting p on q gives p back
    assert np.allclose(q @ (q.T @ p), p, atol=1e-4)
    zero = lowrank.orthonormalize(np.zeros((50, 3), np.float32))
    assert np.all(np.isfinite(zero))


def test_a_sum_of_rank_r_matrices_comes_through_exactly():
    """Two workers whose matrices share one rank-2 column space: the first power iteration
    from a random Q finds it, the sum arrives whole and no residual is left."""
    rng = np.random.RandomState(1)
    basis = rng.standard_normal((40, 2))
    ms = [(basis @ rng.standard_normal((2, 30))).astype(np.float32) for _ in range(2)]
    q = lowrank.initial_q((40, 30), 2, index=0)
    approx, q_next, residuals = lowrank.reference_round(ms, q)
    assert np.allclose(approx, ms[0] + ms[1], atol=1e-4)
    assert all(np.abs(r).max() < 1e-4 for r in residuals)
    assert q_next.shape == (30, 2)


def test_error_feedback_delays_what_the_projection_drops_but_loses_nothing():
    """Full-rank matrices at rank 1: each round sends a projection; what it drops stays in the
    residuals and is sent later, so the sum of everything sent plus what the residuals still
    hold is the sum of everything computed, and a constant signal is sent ever more exactly.
    Without the residuals (dropped each round) the sent total falls behind for good."""
    rng = np.random.RandomState(2)
    signal = [rng.standard_normal((20, 12)).astype(np.float32) for _ in range(2)]
    q = lowrank.initial_q((20, 12), 1, index=3)
    residuals = [np.zeros_like(m) for m in signal]
    sent = np.zeros_like(signal[0])
    q_plain, sent_plain = q.copy(), np.zeros_like(sent)
    rounds = 60
    for _ in range(rounds):
        approx, q, residuals = lowrank.reference_round(
            [m + r for m, r in zip(signal, residuals)], q)
        sent += approx
        approx_plain, q_plain, _ = lowrank.reference_round(signal, q_plain)
        sent_plain += approx_plain
    computed = rounds * (signal[0] + signal[1])
    assert np.allclose(sent + residuals[0] + residuals[1], computed, rtol=1e-4, atol=1e-2)
    with_feedback = np.abs(sent / rounds - (signal[0] + signal[1])).max()
    without = np.abs(sent_plain / rounds - (signal[0] + signal[1])).max()
    assert with_feedback < 0.15 * without, (with_feedback, without)


def test_the_workers_mxnet_side_computes_the_reference_rule():
    """Two LowRankWire objects (two workers) exchange through sums done here; over three
    rounds their approximate sums, residuals and next Q are the numpy rule's."""
    rng = np.random.RandomState(3)
    shapes = [(50, 20, 5, 5), (50,), (500, 800)]
    wires = [lowrank.LowRankWire(shapes, 3, mx.cpu()) for _ in range(2)]
    assert wires[0].indices == [0, 2]
    assert wires[0].key_shapes() == [(50, 3), (500, 3), (500, 3), (800, 3)]
    for wire in wires:
        wire.use_keys([10, 11, 12, 13])
    refs = {i: (lowrank.initial_q(shapes[i], 3, i), [np.zeros(lowrank.matrix_shape(shapes[i]),
                                                              np.float32)] * 2)
            for i in (0, 2)}
    for _ in range(3):
        deltas = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in wires]
        sums = [[mx.nd.zeros(s) for s in shapes] for _ in wires]
        firsts = [w.first([mx.nd.array(d) for d in ds], outs, [0, 1, 2])
                  for w, ds, outs in zip(wires, deltas, sums)]
        for arrays, outs, keys in firsts:
            assert keys == [10, 1, 11]
            assert arrays[0].shape == (50, 3) and arrays[2].shape == (500, 3)
        total = [firsts[0][0][i] + firsts[1][0][i] for i in range(3)]
        for arrays, outs, _ in firsts:
            for out, t in zip(outs, total):
                out[:] = t                                  # the server's sums
        seconds = [w.second() for w in wires]
        assert seconds[0][2] == [12, 13]
        q_total = [seconds[0][0][j] + seconds[1][0][j] for j in range(2)]
        for _, outs, _ in seconds:
            for out, t in zip(outs, q_total):
                out[:] = t
        for w, outs in zip(wires, sums):
            w.finish(outs)
        for i in (0, 2):
            q, residuals = refs[i]
            ms = [d[i].reshape(lowrank.matrix_shape(shapes[i])) + r
                  for d, r in zip(deltas, residuals)]
            approx, q, residuals = lowrank.reference_round(ms, q)
            refs[i] = (q, residuals)
            for w, outs in zip(wires, sums):
                got = outs[i].asnumpy().reshape(approx.shape)
                assert np.allclose(got, approx, rtol=1e-3, atol=1e-3)
                assert np.allclose(w.q[i].asnumpy(), q, rtol=1e-3, atol=1e-3)
            for w, r in zip(wires, residuals):
                assert np.allclose(w.residual[i].asnumpy(), r, rtol=1e-3, atol=1e-3)
            # every worker holds the same approximate sum, bit for bit
            assert np.array_equal(sums[0][i].asnumpy(), sums[1][i].asnumpy())
        assert np.array_equal(sums[0][1].asnumpy(), total[1].asnumpy())   # in full
