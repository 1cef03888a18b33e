"""Rounds sized by compute and transfer (esync.coordination.rules.round_length), hand-computed,
how both policies of esync.coordination.job apply it, and who carries iterations through the
exchange of such a round (esync.worker.algorithms.esync.carries)."""
import pytest

from esync.coordination.job import JobState
from esync.coordination.limits import PolicyError
from esync.coordination.rules import (OVERLAP_MARGIN, RoundSizing, plan_round, round_length,
                                      steady_slowest_rank, transfer_estimate)
from esync.worker.algorithms.esync import carries

SHARE = RoundSizing(comm_share=0.1, max_round=0.0)
C_SLOW = 0.4                    # the x8 device's iteration
C = [0.05, 0.05, 0.2, C_SLOW]   # devices x1, x1, x4, x8


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_free_links_give_todays_rounds():
    # A transfer of 1/20 of the slowest's iteration: 0.02 * 9 = 0.18 s < 0.4 s, so T = c_s
    assert round_length(C_SLOW, 0.02, SHARE) == C_SLOW
    assert plan_round(C, epsilon="auto", length=round_length(C_SLOW, 0.02, SHARE)) == \
        plan_round(C, epsilon="auto") == [8, 8, 2, 1]


def test_unknown_transfer_or_share_one_gives_todays_rounds():
    assert round_length(C_SLOW, 0.0, SHARE) == C_SLOW
    assert round_length(C_SLOW, 10.0, RoundSizing(comm_share=1.0)) == C_SLOW


def test_a_transfer_of_six_slow_iterations_meets_the_share():
    comm = 6 * C_SLOW                               # 2.4 s to move the model
    length = round_length(C_SLOW, comm, SHARE)      # comm / (T + comm) <= 0.1: T >= 9 comm
    assert length == pytest.approx(9 * comm)        # 21.6 s
    ks = plan_round(C, epsilon="auto", length=length)
    # floor(T / c_i + 1/N): the slowest runs 54 iterations, every device fills T
    assert ks == [432, 432, 108, 54]
    for k, c in zip(ks, C):
        assert comm / (k * c + comm) <= 0.1 + 1e-9


def test_the_bound_holds_and_never_cuts_below_one_slow_iteration():
    bounded = RoundSizing(comm_share=0.1, max_round=3.0)
    # whole iterations of the slowest within the bound: 7 x 0.4 s
    assert round_length(C_SLOW, 6 * C_SLOW, bounded) == pytest.approx(2.8)
    assert plan_round(C, epsilon="auto", length=2.8) == [56, 56, 14, 7]
    assert round_length(C_SLOW, 6 * C_SLOW, RoundSizing(comm_share=0.1, max_round=0.3)) == C_SLOW
    assert round_length(5.0, 100.0, bounded) == 5.0                  # c_s above the bound


def test_overlap_only_has_to_outlast_the_transfer():
    overlap = RoundSizing(comm_share=0.1, max_round=0.0, overlap=True)
    assert round_length(C_SLOW, 6 * C_SLOW, overlap) == pytest.approx(OVERLAP_MARGIN * 2.4)
    assert round_length(C_SLOW, 0.1, overlap) == C_SLOW              # hidden already


def test_the_aggregations_arithmetic_counts_with_the_transfer():
    # 0.1 s of transfer + 0.2 s of arithmetic: (0.3) / (T + 0.3) <= 0.1, T >= 2.7 s: 7 of
    # the slowest's iterations
    assert round_length(C_SLOW, 0.1, SHARE, overhead=0.2) == pytest.approx(2.8)
    # the arithmetic alone stretches too (transfer unknown): T >= 1.8 s, 5 iterations
    assert round_length(C_SLOW, 0.0, SHARE, overhead=0.2) == pytest.approx(2.0)
    # ... but share 1 is the original's rounds whatever it costs
    assert round_length(C_SLOW, 0.1, RoundSizing(comm_share=1.0), overhead=0.2) == C_SLOW


def test_overlap_hides_the_transfer_but_not_the_arithmetic():
    overlap = RoundSizing(comm_share=0.1, max_round=0.0, overlap=True)
    # the transfer (0.1 s) is hidden; 0.2 s of arithmetic per round must be 10% of T + 0.2:
    # T >= 1.8 s, 5 of the slowest's iterations
    assert round_length(C_SLOW, 0.1, overlap, overhead=0.2) == pytest.approx(2.0)
    # a long transfer still has to be outlasted
    assert round_length(C_SLOW, 6 * C_SLOW, overlap, overhead=0.2) == \
        pytest.approx(OVERLAP_MARGIN * 2.4)
    bounded = RoundSizing(comm_share=0.1, max_round=1.0, overlap=True)
    assert round_length(C_SLOW, 0.1, bounded, overhead=0.2) == pytest.approx(0.8)  # 2 within 1 s


def test_transfer_is_the_smallest_wait():
    # the last worker to push waits for the transfer alone; the others also for it
    assert transfer_estimate([0.9, 0.3, None, 0.0, 0.5]) == 0.3
    assert transfer_estimate([None, 0.0]) == 0.0


def test_planned_job_stretches_rounds_from_reported_transfers():
    job = JobState(num_workers=4, policy="planned", clock=FakeClock(), sizing=SHARE)
    assert job.report_round(1, [1] * 4, C).plan == [8, 8, 2, 1]       # no transfer known yet
    plan = job.report_round(2, [8, 8, 2, 1], C, [2.5, 2.4, 2.6, 3.0]).plan
    assert plan == [432, 432, 108, 54]
    assert job.snapshot()["round_length"] == pytest.approx(21.6)
    # without sizing the same reports give today's plan
    plain = JobState(num_workers=4, policy="planned", clock=FakeClock())
    plain.report_round(1, [1] * 4, C)
    assert plain.report_round(2, [8, 8, 2, 1], C, [2.5, 2.4, 2.6, 3.0]).plan == [8, 8, 2, 1]


def test_dynamic_slowest_fills_a_stretched_round():
    clock = FakeClock()
    job = JobState(num_workers=2, policy="dynamic", clock=clock, epsilon=0.0,
                   sizing=RoundSizing(comm_share=0.5, max_round=0.0))
    job.apply(0, 1, 0.1)
    job.apply(1, 1, 1.0, d=3.0)       # T = max(1.0, 3.0 * 0.5 / 0.5) = 3.0
    job.enter_round(0, 2)
    job.enter_round(1, 2)
    assert not job.apply(1, 0, 1.0)
    clock.now += 1.0
    first = job.decide(1, 1, 1.0)     # two of its three iterations left, counted
    assert not first.ready and first.budget == pytest.approx(2.5)
    assert not job.apply(0, 10, 0.1)  # the fast one goes on too
    clock.now += 1.0
    assert not job.apply(1, 2, 1.0)   # one of its iterations left
    clock.now += 1.3
    assert job.apply(1, 3, 1.0)       # its third: ready, although its iterations took longer
    assert job.apply(0, 30, 0.1)


def test_dynamic_slowest_runs_its_whole_iterations_of_a_stretched_round():
    """T = 3 of the slowest's 1 s iterations. Its iterations take longer than its c (its
    batches, its questions): after two of them 2.9 s have passed, and the clock would stop it
    there, an iteration early, to wait while the others fill T; counted, it runs its third."""
    clock = FakeClock()
    job = JobState(num_workers=2, policy="dynamic", clock=clock, epsilon=0.0,
                   sizing=RoundSizing(comm_share=0.5, max_round=0.0))
    job.apply(0, 1, 0.1)
    job.apply(1, 1, 1.0, d=3.0)
    job.enter_round(0, 2)
    job.enter_round(1, 2)
    assert not job.apply(1, 0, 1.0)
    clock.now += 1.45
    assert not job.apply(1, 1, 1.0)
    clock.now += 1.45
    second = job.decide(1, 2, 1.0)
    assert not second.ready and second.budget == pytest.approx(1.5)
    clock.now += 1.45
    assert job.apply(1, 3, 1.0)


def test_dynamic_stretched_round_keeps_its_length():
    """A stretched round's T is fixed at its first decision: a worker's new transfer time
    (sent with its first question of a round) moves the next round's, not this one's, where
    the others' leases and the slowest's stop are already counted against it."""
    clock = FakeClock()
    job = JobState(num_workers=2, policy="dynamic", clock=clock, epsilon=0.0,
                   sizing=RoundSizing(comm_share=0.5, max_round=0.0))
    job.apply(0, 1, 0.1)
    job.apply(1, 1, 1.0, d=3.0)       # T = 3 s, three slow iterations
    job.enter_round(0, 2)
    job.enter_round(1, 2)
    assert not job.apply(1, 0, 1.0)
    assert job.snapshot()["round_length"] == pytest.approx(3.0)
    job.apply(0, 5, 0.1, d=0.5)       # a shorter transfer: D = 0.5 s would give T = c_s
    assert job.snapshot()["round_length"] == pytest.approx(3.0)
    job.enter_round(0, 3)
    job.enter_round(1, 3)
    assert not job.apply(1, 0, 1.0)
    assert job.snapshot()["round_length"] == pytest.approx(1.0)


@pytest.mark.parametrize("sizing", [RoundSizing(comm_share=0.0), RoundSizing(comm_share=1.5),
                                    RoundSizing(max_round=-1.0), RoundSizing(overlap="yes")])
def test_bad_sizing_is_refused(sizing):
    with pytest.raises(PolicyError):
        JobState(num_workers=2, sizing=sizing)


def test_bad_transfer_times_are_refused_and_change_nothing():
    job = JobState(num_workers=2, policy="planned", clock=FakeClock(), sizing=SHARE)
    with pytest.raises(PolicyError) as err:
        job.report_round(1, [1, 1], [0.1, 0.2], [0.1, -1])
    assert err.value.field == "d"
    assert job.last_report_t == 0


def test_planned_job_gives_fast_workers_the_time_the_slowest_aggregates():
    """A slow device's aggregation computes for longer (0.2 s against 0.02 s): with the
    reported overheads the fast devices fill that time too, k = floor((T + o_s - o_i) / c_i
    + 1/N)."""
    job = JobState(num_workers=4, policy="planned", clock=FakeClock())
    job.report_round(1, [1] * 4, C)
    plan = job.report_round(2, [8, 8, 2, 1], C, None, [0.02, 0.02, 0.05, 0.2]).plan
    # floor((0.4 + 0.2 - 0.02) / 0.05 + 0.25) = 11, floor((0.4 + 0.2 - 0.05) / 0.2 + 0.25) = 3
    assert plan == [11, 11, 3, 1]
    assert job.report_round(3, plan, C).plan == plan     # kept while no newer overhead comes


def test_a_slow_aggregation_counts_with_the_transfer_when_rounds_are_stretched():
    job = JobState(num_workers=4, policy="planned", clock=FakeClock(), sizing=SHARE)
    job.report_round(1, [1] * 4, C)
    job.report_round(2, [8, 8, 2, 1], C, [0.1, 0.1, 0.1, 0.05], [0.02, 0.02, 0.05, 0.2])
    # the slowest device neither trains nor exchanges for 0.05 + 0.2 s: T >= 9 x 0.25 = 2.25 s,
    # 6 of its iterations
    assert job.snapshot()["round_length"] == pytest.approx(6 * C_SLOW)


def test_with_overlap_the_planned_job_stretches_rounds_for_the_arithmetic_alone():
    overlap = RoundSizing(comm_share=0.1, max_round=0.0, overlap=True)
    job = JobState(num_workers=4, policy="planned", clock=FakeClock(), sizing=overlap)
    job.report_round(1, [1] * 4, C)
    job.report_round(2, [8, 8, 2, 1], C, [0.1, 0.1, 0.1, 0.05], [0.02, 0.02, 0.05, 0.2])
    # the 0.05 s transfer is hidden (T >= 1.5 x 0.05); the slowest's 0.2 s of arithmetic is not:
    # T >= 9 x 0.2 = 1.8 s, 5 of its iterations
    assert job.snapshot()["round_length"] == pytest.approx(5 * C_SLOW)


@pytest.mark.parametrize("round_k,slowest,policy,wait,carry_slowest,want", [
    (8, False, "dynamic", 0.0, False, True),     # a fast device: its exchange is idle time
    (8, False, "planned", 0.0, False, True),
    (3, True, "dynamic", 0.0, False, False),     # the slowest, several iterations a round
    (3, True, "planned", 0.0, False, False),
    (1, True, "dynamic", 0.02, False, False),    # ... even told a wait in a stretched round
    (3, True, "dynamic", 0.0, True, True),       # ... unless --carry-slowest
    (1, False, "dynamic", 0.02, False, True),    # told it would wait for the slowest
    (1, False, "dynamic", 0.0, False, False),
    (1, False, "planned", 0.02, False, False),
])
def test_who_carries_through_the_exchange(round_k, slowest, policy, wait, carry_slowest, want):
    assert carries(round_k, slowest=slowest, policy=policy, told_wait=wait,
                   carry_slowest=carry_slowest) is want


@pytest.mark.parametrize("durations, earlier, want", [
    ([0.004, 0.03], None, 1),              # the first exchange: its timings as they are
    ([0.2, 0.03], None, 0),                # ... a stall there counts
    ([0.2, 0.03], [0.004, 0.03], 1),       # one stall of the x1 device: still the x8 one
    ([0.2, 0.03], [0.25, 0.03], 0),        # two in a row: the x1 device is the slowest now
    ([0.004, 0.03], [0.004, 0.0], 1),      # an untimed exchange before: the latest timing
    ([0.004, 0.0], [0.004, 0.03], None),   # an untimed rank now: nobody
    ([0.03], None, None),                  # one rank: nobody
])
def test_the_slowest_is_read_from_each_ranks_smaller_latest_two(durations, earlier, want):
    """--carry's "the slowest does not carry": a device read as the smaller of its latest two
    exchanged timings, so one stalled iteration of a fast device does not make it the
    slowest (a loaded machine saw the slow device then carry)."""
    assert steady_slowest_rank(durations, earlier) == want
