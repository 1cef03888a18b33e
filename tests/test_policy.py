"""esync.coordination.job: the decision table (docs/ALGORITHM.md), the planned policy, the slack, threads."""
import heapq
import math
import sys
import threading

import pytest

from support import FakeClock

from esync.coordination.limits import AUTO, ERR_C, ERR_EPSILON, ERR_K, ERR_NUM_WORKERS, ERR_POLICY, ERR_RANK, ERR_ROUND, ERR_WRONG_POLICY_APPLY, ERR_WRONG_POLICY_PLAN, PolicyError, PolicyMismatch
from esync.coordination.job import JobRegistry, JobState
from esync.coordination.rules import plan_for, plan_round




@pytest.fixture
def clock():
    return FakeClock()


def dynamic_job(clock, *, num_workers=2, epsilon=0.0):
    return JobState(num_workers=num_workers, epsilon=epsilon, policy="dynamic", clock=clock)


def start_round_two(job, clock, *, slow_c=1.0, fast_c=0.1):
    """Round 1 done (rank 0 fast, rank 1 slow); both enter round 2 and report k=0."""
    job.apply(0, 1, fast_c)
    job.apply(1, 1, slow_c)
    job.enter_round(0, 2)
    job.enter_round(1, 2)
    job.apply(1, 0, slow_c)          # the slowest starts its iteration now
    job.apply(0, 0, fast_c)


# -- the lease: how long a "not ready" stays true ---------------------------------------------

def test_a_not_ready_answer_carries_the_time_left_minus_the_slack(clock):
    job = dynamic_job(clock, epsilon=0.05)
    start_round_two(job, clock)                      # the slowest (c = 1 s) started at t = 0
    assert job.decide(0, 0, 0.1).budget == pytest.approx(1.0 - 0.05)
    clock.advance(0.1)
    decision = job.decide(0, 1, 0.1)
    assert not decision.ready and decision.budget == pytest.approx(0.9 - 0.05)


def _three_workers_in_round_two(clock, epsilon, slowest_started):
    """Ranks 0 (0.1 s), 1 (1 s, the slowest) and 2 (0.3 s) in round 2."""
    job = dynamic_job(clock, num_workers=3, epsilon=epsilon)
    for rank, c in ((0, 0.1), (1, 1.0), (2, 0.3)):
        job.apply(rank, 1, c)
    for rank in range(3):
        job.enter_round(rank, 2)
    if slowest_started:
        job.apply(1, 0, 1.0)
    return job


@pytest.mark.parametrize("epsilon", [0.0, 0.03, AUTO])
@pytest.mark.parametrize("offset", [0.0, 0.013, 0.037])
@pytest.mark.parametrize("slowest_first", [True, False])
def test_asking_within_the_lease_would_have_answered_not_ready(clock, epsilon, offset,
                                                                slowest_first):
    """The lease is the server's own rule run forward. Side by side on one clock: a worker that
    skips its reports within the lease, and one that asks before every iteration (the original
    protocol). Every report skipped would have been "not ready", and both stop at the same k.
    ``slowest_first`` False: the fast worker asks first and the slowest starts ``offset`` later
    (the lease then counts its whole iteration from the fast worker's first call)."""
    leased, asking = (_three_workers_in_round_two(clock, epsilon, slowest_first)
                      for _ in range(2))
    if slowest_first:
        clock.advance(offset)
    lease, asked_at = leased.decide(0, 0, 0.1), clock.now
    asking.apply(0, 0, 0.1)
    if not slowest_first:
        clock.advance(offset)
        for job in (leased, asking):
            job.apply(1, 0, 1.0)
    k, skipped = 0, 0
    while True:
        clock.advance(0.1)
        k += 1
        ready = asking.apply(0, k, 0.1)
        if clock.now - asked_at + 0.1 <= lease.budget:
            skipped += 1
            assert not ready, f"skipped the report of k={k}, which was the last"
            continue
        lease, asked_at = leased.decide(0, k, 0.1), clock.now
        assert lease.ready == ready
        if ready:
            break
    assert skipped >= 5 and 7 <= k <= 10


def test_the_lease_before_the_slowest_starts_is_its_whole_last_iteration(clock):
    job = dynamic_job(clock, epsilon=0.05)
    job.apply(0, 1, 0.1)
    job.apply(1, 1, 1.0)
    job.enter_round(0, 2)                            # the slowest is still in round 1
    first = job.decide(0, 0, 0.1)
    assert (first.ready, first.budget) == (False, pytest.approx(0.95))
    job.enter_round(1, 2)                            # entered, not reported: same
    clock.advance(0.3)
    later = job.decide(0, 1, 0.1)
    assert (later.ready, later.budget) == (False, pytest.approx(0.95))


def test_no_lease_for_the_slowest_or_before_any_duration_is_known(clock):
    job = dynamic_job(clock)
    assert job.decide(0, 0, 0.0).budget == 0.0       # nobody has a duration yet
    job.apply(0, 1, 0.1)
    job.apply(1, 1, 1.0)
    job.enter_round(0, 2)
    job.enter_round(1, 2)
    assert job.decide(1, 0, 1.0).budget == 0.0       # the slowest itself: one iteration, ask


# -- the wait: what a "ready" worker will wait for (--carry computes through it) ------------------

def test_a_ready_fast_worker_is_told_what_is_left_of_the_slowest_iteration(clock):
    job = dynamic_job(clock, epsilon=0.05)
    start_round_two(job, clock)                      # the slowest (c = 1 s) started at t = 0
    clock.advance(0.6)
    assert not job.decide(0, 6, 0.1).ready           # 0.4 s left: one more 0.1 s fits
    clock.advance(0.3)
    told = job.decide(0, 9, 0.1)                     # 0.1 s left, within the 0.05 s slack
    assert told.ready and told.wait == pytest.approx(0.1)


def test_the_slowest_and_a_worker_behind_a_finished_slowest_wait_for_nobody(clock):
    job = dynamic_job(clock)
    start_round_two(job, clock)
    clock.advance(1.0)
    slowest = job.decide(1, 1, 1.0)
    assert slowest.ready and slowest.wait == 0.0
    late = job.decide(0, 10, 0.1)                    # the slowest has already pushed
    assert late.ready and late.wait == 0.0


def test_in_the_first_round_nobody_stops_before_every_device_is_timed(clock):
    """Round 1: nobody's duration is known, so the first to finish may not be the slowest; it
    computes on (asking again after a tenth of the time it has computed, at least one
    iteration) until every device has finished one iteration; the last to report is then the
    slowest, ready at once and waiting for nobody, and the others are ready at their next
    question, with their work in the first aggregate."""
    job = dynamic_job(clock, num_workers=3)
    for rank in range(3):
        job.apply(rank, 0, 0.0)
    clock.advance(0.1)
    first = job.decide(0, 1, 0.1)
    assert not first.ready and first.budget == pytest.approx(0.1)
    clock.advance(0.3)
    assert not job.decide(2, 1, 0.4).ready
    clock.advance(0.6)
    assert not job.decide(0, 10, 0.1).ready
    assert job.decide(0, 10, 0.1).budget == pytest.approx(0.1)
    clock.advance(1.0)
    assert job.decide(0, 20, 0.1).budget == pytest.approx(0.2)   # a tenth of its 2 s so far
    last = job.decide(1, 1, 2.0)
    assert last.ready and last.wait == 0.0
    assert job.decide(0, 21, 0.1).ready and job.decide(2, 5, 0.4).ready


def test_iterations_carried_into_a_round_may_make_a_worker_ready_at_its_first_report(clock):
    """With --carry a worker's first report of a round counts the iterations it carried into it:
    the slowest with any is ready at once; a fast one once no further iteration fits."""
    job = dynamic_job(clock)
    job.apply(0, 3, 0.1)
    job.apply(1, 1, 1.0)
    job.enter_round(0, 2)
    job.enter_round(1, 2)
    assert job.decide(1, 1, 1.0, t=2).ready          # the slowest carried one iteration
    assert job.decide(0, 2, 0.1, t=2).ready          # and the fast one then waits for nobody


# -- the decision table of docs/ALGORITHM.md -------------------------------------------------------

def test_first_report_of_a_round_is_never_ready(clock):
    job = dynamic_job(clock)
    assert job.apply(1, 0, 5.0) is False


def test_not_ready_while_slowest_has_not_entered_the_current_round(clock):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.1)
    job.apply(1, 1, 1.0)
    job.enter_round(0, 2)            # rank 1, the slowest, is still in round 1
    job.apply(0, 0, 0.1)
    clock.advance(10.0)
    assert job.apply(0, 1, 0.1) is False


def test_not_ready_while_slowest_entered_but_has_not_reported_in_the_round(clock):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.1)
    job.apply(1, 1, 1.0)
    job.enter_round(0, 2)
    job.enter_round(1, 2)            # its `seen` still dates from round 1
    clock.advance(10.0)
    assert job.apply(0, 1, 0.1) is False


def test_slowest_itself_is_ready_after_one_iteration(clock):
    job = dynamic_job(clock)
    start_round_two(job, clock)
    clock.advance(1.0)
    assert job.apply(1, 1, 1.0) is True


def test_ready_once_the_slowest_is_ready(clock):
    job = dynamic_job(clock)
    start_round_two(job, clock)
    clock.advance(1.0)
    job.apply(1, 1, 1.0)             # slowest ready; its fresh report makes remaining = c_s again
    assert job.apply(0, 3, 0.1) is True


def test_ready_when_the_next_iteration_would_overrun_the_slowest(clock):
    job = dynamic_job(clock)
    start_round_two(job, clock)
    clock.advance(0.95)              # remaining 0.05 < c_i = 0.1
    assert job.apply(0, 9, 0.1) is True


def test_not_ready_while_one_more_iteration_fits(clock):
    job = dynamic_job(clock)
    start_round_two(job, clock)
    clock.advance(0.5)               # remaining 0.5 > c_i = 0.1
    assert job.apply(0, 5, 0.1) is False


def test_absolute_epsilon_is_added_to_the_iteration_time(clock):
    job = dynamic_job(clock, epsilon=0.5)
    start_round_two(job, clock)
    clock.advance(0.45)              # remaining 0.55 < 0.1 + 0.5
    assert job.apply(0, 4, 0.1) is True


def test_ready_is_remembered_for_the_worker(clock):
    job = dynamic_job(clock)
    start_round_two(job, clock)
    clock.advance(0.95)
    job.apply(0, 9, 0.1)
    assert job.snapshot()["workers"][0]["ready"] is True


# -- rounds and history ----------------------------------------------------------------------

def test_entering_a_new_round_clears_every_k_and_ready(clock):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.1)
    job.apply(1, 1, 1.0)
    entry = job.enter_round(0, 2)
    workers = job.snapshot()["workers"]
    assert entry.new_round and job.current_round == 2
    assert [(w["k"], w["ready"]) for w in workers] == [(0, False), (0, False)]


def test_entering_the_current_round_again_changes_nothing(clock):
    job = dynamic_job(clock)
    job.enter_round(0, 2)
    job.apply(0, 0, 0.1)
    job.apply(0, 1, 0.1)
    entry = job.enter_round(1, 2)
    assert not entry.new_round and entry.record is None
    assert job.snapshot()["workers"][0]["k"] == 1


def test_the_last_worker_of_a_round_others_have_left_is_ready_after_its_iteration(clock):
    """--overlap: a fast worker goes on into round 2 as soon as it has pushed, before the
    slowest is ready in round 1. The slowest is then the last of round 1, which everyone waits
    for: ready after its iteration (not "not ready" because it is not in the current round)."""
    job = dynamic_job(clock)
    job.apply(1, 0, 1.0, t=1)          # the slowest starts round 1
    job.apply(0, 0, 0.1, t=1)
    clock.advance(0.1)
    job.apply(0, 1, 0.1, t=1)
    assert job.apply(0, 0, 0.1, t=2) is False      # rank 0 is in round 2: others left round 1
    clock.advance(0.5)
    assert job.apply(1, 1, 1.0, t=1) is True
    # entering round 2 it starts afresh there: not ready because of round 1's answer
    assert job.apply(1, 0, 1.0, t=2) is False
    assert job.snapshot()["workers"][1]["ready"] is False


def test_closed_round_records_k_c_compute_and_wait(clock):
    job = dynamic_job(clock)
    job.apply(0, 0, 0.0)
    for k in (1, 2):
        clock.advance(0.1)
        job.apply(0, k, 0.1)
    clock.advance(0.3)               # aggregation and waiting
    record = job.enter_round(0, 2).record
    assert (record.round, record.rank, record.k, record.c) == (1, 0, 2, 0.1)
    assert record.compute == pytest.approx(0.2) and record.wait == pytest.approx(0.3)


def test_history_keeps_every_closed_round(clock):
    job = dynamic_job(clock)
    for t in (2, 3):
        for rank in (0, 1):
            job.apply(rank, 1, 0.1)
            job.enter_round(rank, t)
    assert [(r["round"], r["rank"]) for r in job.history_records()] == [(1, 0), (1, 1), (2, 0), (2, 1)]


def test_snapshot_reports_the_slowest_and_every_worker(clock):
    job = dynamic_job(clock, num_workers=3)
    job.apply(2, 1, 0.7)
    snap = job.snapshot()
    assert snap["slowest"] == 2 and len(snap["workers"]) == 3 and snap["round"] == 1


# -- validation: rejected calls change nothing -------------------------------------------------

@pytest.mark.parametrize("rank, k, c, field, message", [
    (2, 1, 0.1, "r", ERR_RANK.format(num_workers=2)),
    (-1, 1, 0.1, "r", ERR_RANK.format(num_workers=2)),
    (0, -1, 0.1, "k", ERR_K),
    (0, 10**12, 0.1, "k", ERR_K),
    (0, True, 0.1, "k", ERR_K),
    (0, 1, -0.1, "c", ERR_C),
    (0, 1, math.nan, "c", ERR_C),
    (0, 1, math.inf, "c", ERR_C),
    (0, 1, 1e9, "c", ERR_C),
])
def test_bad_report_is_rejected_without_changing_state(clock, rank, k, c, field, message):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.2)
    before = job.snapshot()
    with pytest.raises(PolicyError) as info:
        job.apply(rank, k, c)
    assert (info.value.field, info.value.message) == (field, message)
    assert job.snapshot() == before


@pytest.mark.parametrize("kwargs, field, message", [
    ({"num_workers": 0}, "num_workers", ERR_NUM_WORKERS),
    ({"num_workers": 10**6}, "num_workers", ERR_NUM_WORKERS),
    ({"num_workers": 2, "epsilon": -0.5}, "epsilon", ERR_EPSILON),
    ({"num_workers": 2, "epsilon": "fast"}, "epsilon", ERR_EPSILON),
    ({"num_workers": 2, "policy": "greedy"}, "policy", ERR_POLICY),
])
def test_bad_job_configuration_is_rejected(kwargs, field, message):
    with pytest.raises(PolicyError) as info:
        JobState(**kwargs)
    assert (info.value.field, info.value.message) == (field, message)


def test_entering_round_zero_is_rejected(clock):
    job = dynamic_job(clock)
    with pytest.raises(PolicyError) as info:
        job.enter_round(0, 0)
    assert (info.value.field, info.value.message) == ("t", ERR_ROUND)


def test_apply_on_a_planned_job_is_a_policy_mismatch(clock):
    job = JobState(num_workers=2, policy="planned", clock=clock)
    with pytest.raises(PolicyMismatch, match=ERR_WRONG_POLICY_APPLY):
        job.apply(0, 1, 0.1)


def test_plan_on_a_dynamic_job_is_a_policy_mismatch(clock):
    with pytest.raises(PolicyMismatch, match=ERR_WRONG_POLICY_PLAN):
        dynamic_job(clock).plan(0, 0.1)


# -- the planned policy ------------------------------------------------------------------------

def planned_job(clock, durations, *, epsilon=AUTO):
    job = JobState(num_workers=len(durations), epsilon=epsilon, policy="planned", clock=clock)
    for rank, c in enumerate(durations):
        job.plan(rank, c)
    return job


def test_planned_answers_one_while_some_worker_never_reported(clock):
    job = JobState(num_workers=3, policy="planned", clock=clock)
    job.plan(0, 0.01)
    job.plan(1, 0.08)
    assert job.plan(0, 0.01) == 1


def test_planned_answers_one_to_a_worker_without_a_duration_yet(clock):
    job = JobState(num_workers=2, policy="planned", clock=clock)
    job.plan(1, 0.08)
    assert job.plan(0, 0.0) == 1


def test_planned_gives_the_slowest_one_iteration(clock):
    job = planned_job(clock, [0.01, 0.08])
    assert job.plan(1, 0.08) == 1


def test_planned_auto_slack_fills_the_slowest_iteration(clock):
    job = planned_job(clock, [0.01, 0.01, 0.04, 0.08])
    assert [job.plan(rank, c) for rank, c in enumerate([0.01, 0.01, 0.04, 0.08])] == [8, 8, 2, 1]


def test_planned_auto_slack_does_not_lose_an_iteration_to_timing_noise(clock):
    job = planned_job(clock, [0.0406, 0.08])      # measured 1.97x faster: 2 iterations, not 1
    assert job.plan(0, 0.0406) == 2


def test_planned_auto_slack_floors_a_clearly_fractional_ratio(clock):
    job = planned_job(clock, [0.05, 0.05, 0.05, 0.08])   # 1.6x: a second iteration overruns
    assert job.plan(0, 0.05) == 1


def test_planned_absolute_epsilon_is_subtracted_from_the_slowest_duration(clock):
    job = planned_job(clock, [1.0, 4.0], epsilon=0.5)
    assert job.plan(0, 1.0) == 3                  # floor((4 - 0.5) / 1)


def test_planned_uses_the_latest_duration_of_every_worker(clock):
    job = planned_job(clock, [0.01, 0.08])
    job.plan(1, 0.04)
    assert job.plan(0, 0.01) == 4


def test_planned_k_is_recorded_in_the_history(clock):
    job = planned_job(clock, [0.01, 0.08])
    job.plan(0, 0.01)
    clock.advance(0.1)
    record = job.enter_round(0, 2).record
    assert (record.k, record.c, record.compute) == (8, 0.01, pytest.approx(0.08))


# -- the slack: auto versus absolute, 5 ms and 5 s iterations ------------------------------------

def simulate_dynamic_round(durations, *, epsilon, overhead, rounds=2):
    """Event-driven run of `rounds` rounds; returns (k per worker, overshoot) of the last one.

    Each worker asks before every iteration; between two reports it spends its iteration time
    plus `overhead` (request and batch loading). Overshoot: when the last worker became ready
    minus when the slowest did.
    """
    clock = FakeClock(0.0)
    job = JobState(num_workers=len(durations), epsilon=epsilon, clock=clock)
    last_c = [0.0] * len(durations)
    for t in range(1, rounds + 1):
        start = clock.now
        events = [(start, rank, 0) for rank in range(len(durations))]
        heapq.heapify(events)
        ready_at, ks = {}, {}
        while events:
            when, rank, k = heapq.heappop(events)
            clock.now = when
            if k == 0:
                job.enter_round(rank, t)
            if job.apply(rank, k, last_c[rank]):
                ready_at[rank], ks[rank] = when, k
                continue
            last_c[rank] = durations[rank]
            heapq.heappush(events, (when + overhead + durations[rank], rank, k + 1))
        clock.now = max(ready_at.values()) + 0.001
    slowest = max(range(len(durations)), key=lambda r: durations[r])
    return [ks[r] for r in range(len(durations))], max(ready_at.values()) - ready_at[slowest]


@pytest.mark.parametrize("scale", [0.001, 1.0], ids=["5ms-iterations", "5s-iterations"])
def test_auto_slack_fills_the_round_at_any_time_scale(scale):
    durations = [5 * scale, 5 * scale, 20 * scale, 40 * scale]
    ks, overshoot = simulate_dynamic_round(durations, epsilon=AUTO, overhead=0.001)
    assert ks[0] == ks[1] >= 7 and ks[2] >= 2 and ks[3] == 1
    assert overshoot <= durations[0] / 4 + 0.001


def test_absolute_epsilon_degenerates_to_ssgd_with_5ms_iterations():
    durations = [0.005, 0.005, 0.020, 0.040]
    ks, _ = simulate_dynamic_round(durations, epsilon=0.5, overhead=0.001)
    assert ks == [1, 1, 1, 1]


def test_absolute_epsilon_still_works_with_5s_iterations():
    durations = [5.0, 5.0, 20.0, 40.0]
    ks, _ = simulate_dynamic_round(durations, epsilon=0.5, overhead=0.001)
    assert ks[0] == ks[1] == 7 and ks[3] == 1


def test_overhead_is_measured_on_the_server_clock(clock):
    job = dynamic_job(clock)
    job.apply(0, 0, 0.0)
    clock.advance(0.12)
    job.apply(0, 1, 0.1)             # 0.12 s between reports for a 0.1 s iteration
    assert job.snapshot()["workers"][0]["overhead"] == pytest.approx(0.02)


def test_overhead_is_clamped_at_zero(clock):
    job = dynamic_job(clock)
    job.apply(0, 0, 0.0)
    clock.advance(0.09)
    job.apply(0, 1, 0.1)             # a reported duration longer than the gap: no negative overhead
    assert job.snapshot()["workers"][0]["overhead"] == 0.0


def fast_worker_decision(fast_overhead, *, elapsed):
    """Rank 0 (5 ms, given overhead) asks `elapsed` s after rank 1 (40 ms, 1 ms overhead) started."""
    clock = FakeClock()
    job = JobState(num_workers=2, clock=clock)
    job.apply(0, 0, 0.0)
    clock.advance(0.005 + fast_overhead)
    job.apply(0, 1, 0.005)
    job.apply(1, 0, 0.0)
    clock.advance(0.041)
    job.apply(1, 1, 0.040)
    job.enter_round(0, 2)
    job.enter_round(1, 2)
    job.apply(1, 0, 0.040)
    job.apply(0, 0, 0.005)
    clock.advance(elapsed)
    return job.apply(0, 1, 0.005)


def test_auto_slack_lets_a_worker_with_the_same_overhead_go_on():
    assert fast_worker_decision(0.001, elapsed=0.030) is False    # 6 ms to go, the slowest 11


def test_auto_slack_stops_a_worker_with_a_larger_overhead_earlier():
    assert fast_worker_decision(0.010, elapsed=0.030) is True     # 15 ms to go, the slowest 11


# -- threads -------------------------------------------------------------------------------------

def test_concurrent_reports_are_neither_lost_nor_mixed_up():
    workers, iterations = 32, 150
    job = JobState(num_workers=workers)
    barrier = threading.Barrier(workers + 1)
    errors = []

    def worker(rank):
        try:
            barrier.wait()
            for k in range(iterations + 1):
                job.apply(rank, k, 0.001 * (rank + 1))
            job.enter_round(rank, 2)
        except Exception as exc:     # pragma: no cover - reported below
            errors.append(exc)

    def reader():
        barrier.wait()
        for _ in range(200):
            job.snapshot()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(r,)) for r in range(workers)]
        threads.append(threading.Thread(target=reader))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        sys.setswitchinterval(old)
    records = {r["rank"]: r for r in job.history_records()}
    assert not errors and job.current_round == 2 and len(records) == workers
    assert all(records[r]["k"] == iterations and records[r]["c"] == 0.001 * (r + 1)
               for r in range(workers))
    assert [w["requests"] for w in job.snapshot()["workers"]] == [iterations + 2] * workers


class GateClock:
    """A clock whose first reading blocks until the test opens the gate."""

    def __init__(self):
        self.reading = threading.Event()
        self.gate = threading.Event()
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        if self.calls == 1:
            self.reading.set()
            self.gate.wait(timeout=10)
        return 100.0 + self.calls


def test_a_call_waits_until_the_call_in_progress_has_finished():
    clock = GateClock()
    job = JobState(num_workers=2, clock=clock)
    first = threading.Thread(target=job.apply, args=(0, 1, 0.5))
    first.start()
    clock.reading.wait(timeout=10)             # the first call is inside, reading the clock
    seen = []
    second = threading.Thread(target=lambda: seen.append(job.snapshot()))
    second.start()
    second.join(timeout=0.3)
    blocked = second.is_alive()
    clock.gate.set()
    first.join(timeout=10)
    second.join(timeout=10)
    assert blocked and seen[0]["workers"][0]["c"] == 0.5


def test_registry_setdefault_keeps_the_installed_job():
    registry = JobRegistry()
    first = registry.setdefault(JobState(num_workers=2, name="a"))
    second = registry.setdefault(JobState(num_workers=3, name="a"))
    assert second is first and registry.names() == ["a"]


# -- idempotency: rounds only move forward, retries count once ------------------------------------

def test_entering_an_older_round_changes_nothing(clock):
    job = dynamic_job(clock)
    job.enter_round(0, 3)
    entry = job.enter_round(0, 2)
    assert (entry.stale, entry.record, job.snapshot()["workers"][0]["round"]) == (True, None, 3)


def test_a_repeated_reset_closes_the_round_once(clock):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.1)
    job.enter_round(0, 2)
    job.enter_round(0, 2)
    assert [(r["round"], r["rank"]) for r in job.history_records()] == [(1, 0)]


def test_a_repeated_apply_counts_its_iteration_once(clock):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.1)
    job.apply(0, 1, 0.1)
    assert job.enter_round(0, 2).record.compute == pytest.approx(0.1)


def test_apply_of_an_older_round_is_ignored(clock):
    job = dynamic_job(clock)
    job.enter_round(0, 3)
    before = job.snapshot()
    assert job.apply(0, 4, 0.5, t=2) is True and job.snapshot() == before


def test_apply_of_a_newer_round_enters_it_first(clock):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.1, t=1)
    job.apply(0, 0, 0.1, t=2)
    assert (job.current_round, [r["round"] for r in job.history_records()]) == (2, [1])


def test_plan_of_an_older_round_answers_without_changing_state(clock):
    job = JobState(num_workers=2, epsilon=AUTO, policy="planned", clock=clock)
    job.enter_round(0, 3)
    before = job.snapshot()
    job.plan(0, 0.5, t=1)
    assert job.snapshot() == before


# -- one report per round (rank 0) -------------------------------------------------------------

def empty_planned_job(clock, num_workers=4, epsilon=AUTO):
    return JobState(num_workers=num_workers, epsilon=epsilon, policy="planned", clock=clock)


@pytest.mark.parametrize("epsilon", [AUTO, 0.0, 0.005])
@pytest.mark.parametrize("durations", [[0.01, 0.01, 0.04, 0.08], [0.0406, 0.08, 0.02, 0.013],
                                       [0.5, 0.5, 0.5, 0.5], [0.001, 2.0, 0.3, 0.07]])
def test_round_report_plans_what_plan_gives_for_the_same_durations(clock, durations, epsilon):
    per_worker = empty_planned_job(clock, epsilon=epsilon)
    for rank, c in enumerate(durations):
        per_worker.plan(rank, c)
    legacy = [per_worker.plan(rank, c) for rank, c in enumerate(durations)]
    report = empty_planned_job(clock, epsilon=epsilon).report_round(1, [1] * 4, durations)
    assert report.plan == legacy == plan_round(durations, epsilon=epsilon)


def test_plan_for_and_plan_round_agree_on_every_rank():
    durations = [0.013, 0.08, 0.0406, 0.02, 0.079]
    assert [plan_for(rank, durations, epsilon=AUTO) for rank in range(5)] == plan_round(
        durations, epsilon=AUTO)


def test_round_report_records_every_worker_of_the_round(clock):
    job = empty_planned_job(clock, num_workers=2)
    job.report_round(1, [3, 1], [0.02, 0.06])
    assert [(r["round"], r["rank"], r["k"], r["c"]) for r in job.history_records()] == [
        (1, 0, 3, 0.02), (1, 1, 1, 0.06)]


def test_round_report_moves_every_worker_into_the_next_round(clock):
    job = empty_planned_job(clock, num_workers=2)
    job.report_round(4, [3, 1], [0.02, 0.06])
    snapshot = job.snapshot()
    assert (snapshot["round"], [w["round"] for w in snapshot["workers"]]) == (5, [5, 5])


def test_a_repeated_round_report_answers_the_same_plan_and_records_nothing(clock):
    job = empty_planned_job(clock, num_workers=2)
    first = job.report_round(1, [1, 1], [0.02, 0.06])
    job.take_changes()
    again = job.report_round(1, [9, 9], [0.5, 0.01])
    assert (again.plan, again.duplicate, bool(job.take_changes())) == (first.plan, True, False)


def test_an_older_round_report_answers_the_plan_given_then(clock):
    job = empty_planned_job(clock, num_workers=2)
    first = job.report_round(1, [1, 1], [0.02, 0.06])
    job.report_round(2, [3, 1], [0.01, 0.06])
    assert job.report_round(1, [1, 1], [0.02, 0.06]).plan == first.plan == [3, 1]


@pytest.mark.parametrize("ks, cs, field", [([1], [0.1, 0.1], "k"), ([1, 1], [0.1], "c"),
                                           ([1, -1], [0.1, 0.1], "k"), ([1, 1], [0.1, -2], "c"),
                                           ([1, True], [0.1, 0.1], "k"),
                                           ([1, 1], [0.1, 10 ** 400], "c"),
                                           ("11", [0.1, 0.1], "k")])
def test_bad_round_report_is_rejected_without_changing_state(clock, ks, cs, field):
    job = empty_planned_job(clock, num_workers=2)
    before = job.snapshot()
    with pytest.raises(PolicyError) as info:
        job.report_round(1, ks, cs)
    assert (info.value.field, job.snapshot()) == (field, before)


def test_round_report_on_a_dynamic_job_is_a_policy_mismatch(clock):
    with pytest.raises(PolicyMismatch):
        dynamic_job(clock).report_round(1, [1, 1], [0.1, 0.1])


def test_integer_too_large_for_a_float_is_a_policy_error(clock):
    with pytest.raises(PolicyError):
        dynamic_job(clock).apply(0, 1, 10 ** 400)


# -- persistence: changes to write, and a rebuild from them --------------------------------------

def test_take_changes_hands_out_each_closed_round_once(clock):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.1)
    job.enter_round(0, 2)
    first, second = job.take_changes(), job.take_changes()
    assert ([r.round for r in first.records], second.records) == ([1], [])


def test_a_job_restored_from_its_worker_states_decides_like_the_original(clock):
    job = empty_planned_job(clock, num_workers=3)
    job.report_round(1, [2, 1, 4], [0.04, 0.08, 0.02])
    rebuilt = empty_planned_job(clock, num_workers=3)
    rebuilt.restore(dict(enumerate(job.worker_states())), last_report_t=1,
                    last_plan=job.report_round(1, [0] * 3, [0.0] * 3).plan)
    assert ([w["round"] for w in rebuilt.snapshot()["workers"]], rebuilt.plan(2, 0.02)) == (
        [2, 2, 2], job.plan(2, 0.02))


def test_a_batch_of_round_reports_equals_the_reports_one_by_one(clock):
    reports = [(t, [t, 1, 2], [0.01 * t, 0.08, 0.04]) for t in (1, 2, 3)]
    one_by_one = empty_planned_job(clock, num_workers=3)
    answers = [one_by_one.report_round(*report).plan for report in reports]
    batched = empty_planned_job(clock, num_workers=3)
    assert (batched.report_rounds(reports).plan, batched.history_records()) == (
        answers[-1], one_by_one.history_records())


def test_a_slowest_already_ready_lets_the_others_go_after_a_restore(clock):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.01)
    job.apply(1, 1, 0.3)                                 # the slowest: ready, now aggregating
    rebuilt = dynamic_job(clock)
    rebuilt.restore(dict(enumerate(job.worker_states())))
    assert rebuilt.apply(0, 1, 0.01) is True


def test_the_first_ready_of_a_round_asks_to_be_persisted(clock):
    job = dynamic_job(clock)
    job.apply(0, 1, 0.01)
    job.take_changes()
    job.apply(1, 1, 0.3)
    assert job.needs_persisting()


# -- the planned count when a device slows down within its round --------------------------------

def test_the_planned_round_budget_is_the_others_planned_computing():
    from esync.coordination.rules import planned_round_budget
    plan, cs = [10, 10, 2, 1], [0.05, 0.05, 0.24, 0.52]
    assert planned_round_budget(0, plan, cs) == pytest.approx(0.52)       # the slowest's one
    assert planned_round_budget(3, plan, cs) == pytest.approx(0.5)        # without itself
    assert planned_round_budget(0, [3], [0.1]) == 0.0                     # one worker: none
    assert planned_round_budget(0, [10, 0], [0.05, 0.0]) == 0.0           # nothing known yet


def test_a_device_slowed_within_its_round_stops_at_the_others_time_not_its_count():
    from esync.coordination.rules import PLANNED_OVERRUN, planned_continue

    def run(planned, durations, budget):
        k, used = 0, 0.0
        while planned_continue(k, planned, used, durations[k - 1] if k else 0.0, budget):
            used += durations[k]
            k += 1
        return k, used

    # At its planned speed the count runs, whatever the budget's slack.
    assert run(10, [0.05] * 10, 0.52) == (10, pytest.approx(0.5))
    assert run(10, [0.07] * 10, 0.52)[0] == 10               # 35% slower: still within 1.5x
    # 6x slower from its third iteration on: it stops by 1.5x the others' 0.52 s, not at 3.1 s.
    k, used = run(10, [0.05, 0.05] + [0.3] * 8, 0.52)
    assert k == 4 and used == pytest.approx(0.7) and used <= PLANNED_OVERRUN * 0.52
    # The first iteration always runs (a round needs a delta); unknown budget: the count.
    assert run(10, [2.0] * 10, 0.52)[0] == 1
    assert run(4, [0.3] * 4, 0.0)[0] == 4
    assert run(1, [0.05], 0.52)[0] == 1                      # the slowest's one
