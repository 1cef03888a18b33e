"""esync.coordination: devices too slow to wait for run late (rules.late_ranks), and the fast
devices' rounds are bounded by their own time (JobState.decide with a fake clock)."""
import pytest

from support import FakeClock

from esync.coordination.job import JobState
from esync.coordination.rules import (BOUNDED_ROUND_ITERATIONS, RoundSizing, bounded_length,
                                      late_ranks, late_weight)




FAST_C, SLOW_C = 0.1, 5.0          # one device 50x slower than the other


def test_the_default_cluster_has_no_late_device():
    assert late_ranks([0.1, 0.1, 0.4, 0.8]) == set()


def test_the_wide_gap_cluster_runs_its_two_slow_devices_late():
    assert late_ranks([0.1, 0.1, 5.0, 15.0]) == {2, 3}


def test_nobody_runs_late_while_a_device_is_untimed():
    assert late_ranks([0.1, 0.0, 15.0]) == set()


def test_a_late_device_stays_late_until_it_is_within_eight_times_the_fastest():
    assert late_ranks([0.1, 1.2]) == set()
    assert late_ranks([0.1, 1.2], already={1}) == {1}
    assert late_ranks([0.1, 0.7], already={1}) == set()


def test_a_bounded_round_lasts_a_few_iterations_of_the_fastest_or_the_slowest_on_time_one():
    assert bounded_length([0.1, 0.1]) == pytest.approx(BOUNDED_ROUND_ITERATIONS * 0.1)
    assert bounded_length([0.1, 0.8]) == pytest.approx(0.8)


def test_a_late_delta_is_scaled_down_by_the_rounds_it_missed():
    assert late_weight(0) == 1.0
    assert late_weight(9) == pytest.approx(0.1)


def _after_round_one(*, late: bool, slow_rank: int = 1):
    """Two workers, rank ``slow_rank`` 50x slower; round 1 ends with its "ready"."""
    clock = FakeClock()
    job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock,
                   sizing=RoundSizing(late=late))
    if slow_rank == 0:
        job.decide(0, 0, 0.0, t=1)
        job.decide(1, 1, FAST_C, t=1)
        clock.advance(SLOW_C)
        return job, clock, job.decide(0, 1, SLOW_C, t=1)
    job.decide(1, 0, 0.0, t=1)
    job.decide(0, 1, FAST_C, t=1)
    clock.advance(SLOW_C)
    slow_ready = job.decide(1, 1, SLOW_C, t=1)
    fast_ready = job.decide(0, 50, FAST_C, t=1)
    assert slow_ready.ready and fast_ready.ready
    return job, clock, slow_ready


def test_the_slow_devices_ready_tells_it_to_run_late():
    _, _, slow_ready = _after_round_one(late=True)
    assert slow_ready.late


def test_rank_0_never_runs_late():
    _, _, slow_ready = _after_round_one(late=True, slow_rank=0)
    assert slow_ready.ready and not slow_ready.late


def test_a_job_whose_workers_cannot_run_late_never_tells_one_to():
    _, _, slow_ready = _after_round_one(late=False)
    assert not slow_ready.late


def _fast_iterations_until_ready(job, clock, limit=100, slow_entered=True) -> int:
    """Round 2: the slow device starts its iteration; the fast one iterates and asks."""
    if slow_entered:
        job.decide(1, 0, SLOW_C, t=2)
    for k in range(1, limit + 1):
        clock.advance(FAST_C)
        if job.decide(0, k, FAST_C, t=2 if k == 1 else None).ready:
            return k
    return limit + 1


def test_while_the_late_device_computes_the_fast_one_stops_after_a_bounded_round():
    job, clock, _ = _after_round_one(late=True)
    assert _fast_iterations_until_ready(job, clock) == BOUNDED_ROUND_ITERATIONS


def test_without_late_devices_the_fast_one_computes_through_the_slow_iteration():
    job, clock, _ = _after_round_one(late=False)
    assert _fast_iterations_until_ready(job, clock) >= 0.8 * SLOW_C / FAST_C


def test_the_late_device_is_not_waited_for_before_it_has_entered_the_next_round():
    # A CPU-capped slow device enters its next round seconds after the others (its
    # aggregation computes at its speed): the fast device's round must not wait for that.
    job, clock, _ = _after_round_one(late=True)
    assert (_fast_iterations_until_ready(job, clock, slow_entered=False)
            == BOUNDED_ROUND_ITERATIONS)


def test_the_late_device_is_ready_after_its_one_iteration_many_rounds_later():
    job, clock, _ = _after_round_one(late=True)
    job.decide(1, 0, SLOW_C, t=2)
    for t in range(2, 12):                       # the fast device's bounded rounds
        for k in range(1, BOUNDED_ROUND_ITERATIONS + 1):
            clock.advance(FAST_C)
            job.decide(0, k, FAST_C, t=t if k == 1 else None)
    assert job.decide(1, 1, SLOW_C, t=2).ready


def test_a_device_told_it_is_no_longer_late_is_left_out_until_its_next_round():
    job, clock, _ = _after_round_one(late=True)
    job.decide(1, 0, SLOW_C, t=2)
    clock.advance(0.7)
    job.decide(0, 1, 0.7, t=2)                   # the fast device slowed down: 5.0 / 0.7 < 8
    answer = job.decide(1, 1, SLOW_C, t=2)
    assert answer.ready and not answer.late
    # Its push (a late one) ends this round: it stays out of this round's sizing ...
    assert job.snapshot()["workers"][1].get("late") is True
    # ... and is waited for again from its next round on.
    job.decide(1, 0, SLOW_C, t=3)
    assert "late" not in job.snapshot()["workers"][1]
