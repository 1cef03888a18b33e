"""ESync's aggregation rules on hand-made arrays, checked against values computed by hand."""
import numpy as np
import pytest
from mxnet import nd

from esync.worker.algorithms import aggregate as agg

START = np.array([1.0, -2.0])
DELTAS = [np.array([0.4, 0.8]), np.array([-0.2, 0.2]), np.array([0.1, -0.6])]
KS = [4, 2, 1]


def close(got, want):
    return np.allclose(np.asarray(got, dtype=np.float64), want, rtol=1e-12, atol=1e-12)


def test_mean_is_start_plus_gl_times_average_delta():
    # average delta: (0.3/3, 0.4/3) = (0.1, 0.13333..); gl 2: start + (0.2, 0.26666..)
    assert close(agg.mean(START, DELTAS, 2.0), [1.2, -2.0 + 0.8 / 3])


def test_weighted_by_k_is_start_plus_gl_times_k_weighted_average():
    # sum k_i d_i = 4*(0.4,0.8) + 2*(-0.2,0.2) + 1*(0.1,-0.6) = (1.3, 3.0); / 7
    assert close(agg.weighted(START, DELTAS, KS, 1.0), [1.0 + 1.3 / 7, -2.0 + 3.0 / 7])


def test_weighted_by_samples_uses_the_given_weights():
    # weights (64, 0, 64): (d_0 + d_2) / 2 = (0.25, 0.1)
    assert close(agg.weighted(START, DELTAS, [64, 0, 64], 1.0), [1.25, -1.9])


def test_fednova_rescales_the_step_normalised_average_by_the_effective_steps():
    # d_i / k_i = (0.1, 0.2), (-0.1, 0.1), (0.1, -0.6); mean = (0.1/3, -0.3/3) = (1/30, -0.1)
    # effective steps = mean(k) = 7/3; gl 0.5: start + 0.5 * 7/3 * (1/30, -0.1)
    assert close(agg.fednova(START, DELTAS, KS, 0.5),
                 [1.0 + 0.5 * 7 / 3 / 30, -2.0 - 0.5 * 7 / 3 * 0.1])


def test_fednova_with_data_shares_weights_by_share():
    # p = (0.5, 0.25, 0.25): effective steps 0.5*4 + 0.25*2 + 0.25*1 = 2.75
    # sum p_i d_i / k_i = 0.5*(0.1,0.2) + 0.25*(-0.1,0.1) + 0.25*(0.1,-0.6) = (0.05, -0.025)
    assert close(agg.fednova(START, DELTAS, KS, 1.0, shares=[0.5, 0.25, 0.25]),
                 [1.0 + 2.75 * 0.05, -2.0 - 2.75 * 0.025])


@pytest.mark.parametrize("rule", ["weighted", "fednova"])
def test_equal_steps_make_every_rule_the_mean(rule):
    assert close(agg.aggregate(rule, START, DELTAS, [3, 3, 3], 0.7), agg.mean(START, DELTAS, 0.7))


@pytest.mark.parametrize("rule", agg.RULES)
def test_push_and_sum_weights_reproduce_the_rule_through_a_summing_server(rule):
    pushed_sum = sum(agg.push_weight(rule, k) * d for k, d in zip(KS, DELTAS))
    got = START + 0.7 * agg.sum_weight(rule, KS) * pushed_sum
    assert close(got, agg.aggregate(rule, START, DELTAS, KS, 0.7))


def test_rules_work_on_mxnet_arrays():
    got = agg.fednova(nd.array(START, dtype="float64"),
                      [nd.array(d, dtype="float64") for d in DELTAS], KS, 0.5)
    assert close(got.asnumpy(), agg.fednova(START, DELTAS, KS, 0.5))


def test_momentum_zero_step_is_the_delta_itself():
    delta = np.array([0.3, -0.1])
    step, buffer = agg.OuterOptimizer(momentum=0.0, nesterov=True).step(delta, None)
    assert step is delta and buffer is None


def test_heavy_ball_momentum_accumulates_the_deltas():
    outer = agg.OuterOptimizer(momentum=0.5)
    buffer = np.zeros(2)
    steps = []
    for delta in (np.array([1.0, 2.0]), np.array([1.0, 0.0])):
        step, buffer = outer.step(delta, buffer)
        steps.append(step)
    # buffer 1: (1, 2); buffer 2: 0.5*(1,2) + (1,0) = (1.5, 1)
    assert close(np.stack(steps), [[1.0, 2.0], [1.5, 1.0]])


def test_nesterov_momentum_looks_ahead_by_the_new_buffer():
    outer = agg.OuterOptimizer(momentum=0.9, nesterov=True)
    buffer = np.zeros(1)
    steps = []
    for delta in (np.array([1.0]), np.array([2.0])):
        step, buffer = outer.step(delta, buffer)
        steps.append(float(step[0]))
    # round 1: buffer 1, step 1 + 0.9*1 = 1.9; round 2: buffer 0.9 + 2 = 2.9, step 2 + 2.61 = 4.61
    assert close(steps, [1.9, 4.61])


@pytest.mark.parametrize("momentum,nesterov,gl", [(0.0, False, 1.0), (0.0, False, 0.7),
                                                   (0.9, False, 1.0), (0.9, False, 0.7),
                                                   (0.9, True, 1.0), (0.9, True, 0.7)])
def test_fused_update_follows_step_and_apply_step(momentum, nesterov, gl):
    """The worker's outer step (MXNet's fused kernels, one pass on a slow device) is the rule:
    float32, four rounds with the pulled sum scaled, the model within float32 rounding of the
    spelled-out step and the kernels' state gl times the buffer."""
    outer = agg.OuterOptimizer(momentum=momentum, nesterov=nesterov)
    rng = np.random.default_rng(5)
    start = nd.array(rng.standard_normal(1000), dtype="float32")
    ref_start, ref_buffer = start.asnumpy().astype(np.float64), np.zeros(1000)
    velocity = nd.zeros(1000, dtype="float32") if outer.has_state else None
    for scale in (0.25, 1.0, 0.5, 0.125):
        total = nd.array(rng.standard_normal(1000) * 0.01, dtype="float32")
        kept = total.asnumpy()
        step, new = outer.step(scale * kept.astype(np.float64),
                               ref_buffer if outer.has_state else None)
        ref_start = agg.apply_step(ref_start, step, gl)
        if new is not None:
            ref_buffer = new
        outer.update(start, total, velocity, scale=scale, global_lr=gl)
        assert (total.asnumpy() == kept).all()                  # the pulled sum is left as it was
        assert np.allclose(start.asnumpy(), ref_start, rtol=1e-6, atol=1e-7)
        if outer.has_state:
            assert np.allclose(velocity.asnumpy(), gl * ref_buffer, rtol=1e-6, atol=1e-9)
            assert np.allclose(outer.buffer_from(velocity, gl).asnumpy(), ref_buffer,
                               rtol=1e-6, atol=1e-9)


def test_adam_outer_step_hand_computed():
    """FedAdam's step on the pseudo-gradient -delta, without bias correction: a first delta of
    2 gives mean -0.2, variance 0.04, step 0.2 / (0.2 + tau); a coordinate's step stays near 1
    (times -gl) whatever its delta's size."""
    outer = agg.OuterOptimizer(momentum=0.9, adam=True, beta2=0.99, epsilon=1e-3)
    step, (mean, variance) = outer.step(np.array([2.0, 2e-4]), (np.zeros(2), np.zeros(2)))
    assert close(mean, [-0.2, -2e-5]) and close(variance, [0.04, 4e-10])
    assert close(step, [0.2 / (0.2 + 1e-3), 2e-5 / (2e-5 + 1e-3)])
    # round 2, delta -1: mean 0.9 * -0.2 + 0.1 * 1 = -0.08; variance 0.99 * 0.04 + 0.01 = 0.0496
    step, (mean, variance) = outer.step(np.array([-1.0, 0.0]), (mean, variance))
    assert close(mean[0], -0.08) and close(variance[0], 0.0496)
    assert close(step[0], 0.08 / (0.0496 ** 0.5 + 1e-3))
    # plain heavy-ball momentum on the same deltas moves by the deltas' size instead
    assert not close(agg.OuterOptimizer(momentum=0.9).step(np.array([2.0]), np.zeros(1))[0],
                     [0.2 / (0.2 + 1e-3)])


@pytest.mark.parametrize("beta1,gl", [(0.9, 0.01), (0.0, 0.03)])
def test_fused_adam_update_follows_step_and_apply_step(beta1, gl):
    """MXNet's adam_update (one pass) is the spelled-out FedAdam step, its state the two
    moments as they are (a checkpoint keeps them unconverted)."""
    outer = agg.OuterOptimizer(momentum=beta1, adam=True)
    assert outer.has_state
    rng = np.random.default_rng(7)
    start = nd.array(rng.standard_normal(1000), dtype="float32")
    ref = start.asnumpy().astype(np.float64)
    ref_state = (np.zeros(1000), np.zeros(1000))
    mean, variance = nd.zeros(1000), nd.zeros(1000)
    for scale in (0.25, 1.0, 0.5, 0.125):
        total = nd.array(rng.standard_normal(1000) * 0.01, dtype="float32")
        step, ref_state = outer.step(scale * total.asnumpy().astype(np.float64), ref_state)
        ref = agg.apply_step(ref, step, gl)
        outer.update(start, total, mean, scale=scale, global_lr=gl, variance=variance)
        assert np.allclose(start.asnumpy(), ref, rtol=1e-5, atol=1e-6)
        assert np.allclose(mean.asnumpy(), ref_state[0], rtol=1e-5, atol=1e-9)
        assert np.allclose(variance.asnumpy(), ref_state[1], rtol=1e-5, atol=1e-12)


def test_velocity_and_buffer_convert_both_ways():
    buffer = nd.array([1.0, -2.0, 0.5])
    velocity = agg.OuterOptimizer.velocity_from(buffer, 0.7)
    assert velocity is buffer                                   # in place: the state's own array
    assert np.allclose(velocity.asnumpy(), [0.7, -1.4, 0.35])
    assert np.allclose(agg.OuterOptimizer.buffer_from(velocity, 0.7).asnumpy(), [1.0, -2.0, 0.5])


def test_apply_step_moves_start_by_gl_times_step():
    assert close(agg.apply_step(START, np.array([0.5, 1.0]), 0.7), [1.35, -1.3])


def test_fednova_refuses_a_worker_without_steps():
    with pytest.raises(agg.AggregationError, match="k_i >= 1"):
        agg.fednova(START, DELTAS, [2, 0, 1])


def test_sum_applies_every_delta_in_full_n_times_the_mean_step():
    # sum of deltas: (0.4 - 0.2 + 0.1, 0.8 + 0.2 - 0.6) = (0.3, 0.4); gl 0.5: start + (0.15, 0.2)
    assert close(agg.total(START, DELTAS, 0.5), [1.15, -1.8])
    assert close(agg.aggregate("sum", START, DELTAS, KS, 1.0) - START,
                 len(DELTAS) * (agg.mean(START, DELTAS, 1.0) - START))


@pytest.mark.parametrize("rule", agg.RULES)
def test_scaffold_corrections_cancel_in_every_rule_with_unequal_steps(rule):
    """A round's constant correction c - c_i moves delta_i by -lr k_i (c - c_i); with c the
    variate-weighted mean of the c_i the rule's aggregate of those moves is zero, whatever the
    k_i. The plain mean of the c_i (SCAFFOLD's, for equal k) leaves a drift unless k is equal."""
    variates = DELTAS                                   # any three c_i
    c = agg.global_variate(rule, variates, KS)
    moves = [-0.1 * k * (c - ci) for k, ci in zip(KS, variates)]
    assert close(agg.aggregate(rule, START, moves, KS), START)
    plain = sum(variates) / 3
    plain_moves = [-0.1 * k * (plain - ci) for k, ci in zip(KS, variates)]
    drifts = not close(agg.aggregate(rule, START, plain_moves, KS), START)
    assert drifts == (rule != "fednova")


def test_global_variate_weights_by_steps_hand_computed():
    # sum: weights (4, 2, 1): (4*(0.4,0.8) + 2*(-0.2,0.2) + (0.1,-0.6)) / 7 = (1.3, 3.0) / 7
    assert close(agg.global_variate("sum", DELTAS, KS), [1.3 / 7, 3.0 / 7])
    # weighted: (16, 4, 1): (6.4 - 0.8 + 0.1, 12.8 + 0.8 - 0.6) / 21
    assert close(agg.global_variate("weighted", DELTAS, KS), [5.7 / 21, 13.0 / 21])
    assert close(agg.global_variate("fednova", DELTAS, KS), [0.1, 0.4 / 3])
    with pytest.raises(agg.AggregationError, match="no worker ran a step"):
        agg.global_variate("sum", DELTAS, [0, 0, 0])
