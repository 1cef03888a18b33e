"""The control vector every aggregation pushes: [stop, samples, k_0.., c_0.., plan_0..], summed."""
import numpy as np
import pytest

from esync.worker.kvstore import control_length, control_vector, read_control


def summed(vectors):
    return np.sum(vectors, axis=0, dtype=np.float32)     # what the parameter server does


def test_sum_of_three_workers_carries_every_workers_k_c_and_rank_zeros_plan():
    vectors = [control_vector(3, 0, stop=False, samples=64, k=4, c=0.25, plan=[4, 2, 1]),
               control_vector(3, 1, stop=True, samples=32, k=2, c=0.5),
               control_vector(3, 2, stop=False, samples=16, k=1, c=1.0)]
    got = read_control(summed(vectors), 3)
    assert (got.stop, got.samples, got.k, got.c, got.plan) == (
        True, 112, [4, 2, 1], [0.25, 0.5, 1.0], [4, 2, 1])


def test_no_plan_reads_as_zeros():
    vectors = [control_vector(2, r, stop=False, samples=8, k=1, c=0.1) for r in range(2)]
    assert read_control(summed(vectors), 2).plan == [0, 0]


def test_length_is_two_plus_three_per_worker():
    assert control_vector(5, 4, stop=False, samples=0).shape == (control_length(5),) == (27,)


def test_a_plan_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="3 values for 2 workers"):
        control_vector(2, 0, stop=False, samples=0, plan=[1, 2, 3])
