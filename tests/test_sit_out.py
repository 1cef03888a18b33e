"""Devices too slow to wait for sit out (esync.coordination: rules.sitting_out_ranks and
JobState.decide with a fake clock; the worker's side in ReadinessAsker, the flag's checks)."""
import numpy as np
import pytest

from esync.coordination.client import ReadinessAsker
from esync.coordination.job import JobState
from esync.coordination.limits import PolicyError
from esync.coordination.rules import (BOUNDED_ROUND_ITERATIONS, Decision, RoundSizing,
                                      bounded_length, sitting_out_ranks)
from support import FakeClock, device_logs, processes_mentioning, run_cluster

FAST_C, SLOW_C = 0.1, 5.0          # one device 50x slower than the other
RATIO = 16.0


# -- the rule ---------------------------------------------------------------------------------

def test_the_default_cluster_has_no_device_that_sits_out():
    assert sitting_out_ranks([0.1, 0.1, 0.4, 0.8], RATIO) == set()


def test_on_the_wide_gap_cluster_both_slow_devices_sit_out():
    assert sitting_out_ranks([0.1, 0.1, 5.0, 15.0], RATIO) == {2, 3}


def test_a_device_is_judged_against_the_timed_ones_and_an_untimed_one_never():
    # the untimed device can only be faster than 0.1 or slower than 15: either way rank 2
    # stays over 32 times the fastest, so its warm-up alone decides
    assert sitting_out_ranks([0.1, 0.0, 15.0], RATIO) == {2}
    assert sitting_out_ranks([0.0, 0.0, 15.0], RATIO) == set()
    assert sitting_out_ranks([0.1, 15.0], 0.0) == set()


def test_a_round_while_some_device_sits_out_lasts_8_fast_iterations_or_the_slowest_remaining():
    assert bounded_length([0.1, 0.1]) == pytest.approx(BOUNDED_ROUND_ITERATIONS * 0.1)
    assert bounded_length([0.1, 1.2]) == pytest.approx(1.2)


@pytest.mark.parametrize("ratio", [-1.0, 1.0, 1.5, 2e6, float("nan")])
def test_a_job_refuses_a_ratio_that_is_neither_0_nor_at_least_2(ratio):
    with pytest.raises(PolicyError, match="sit_out must be 0"):
        JobState(num_workers=2, sizing=RoundSizing(sit_out=ratio))


def test_the_sizing_record_names_the_ratio_only_when_it_is_on():
    assert "sit_out" not in RoundSizing().as_dict()
    assert RoundSizing(sit_out=16.0).as_dict()["sit_out"] == 16.0


# -- the state server's decisions ---------------------------------------------------------------

def _after_round_one(*, ratio: float = RATIO, slow_rank: int = 1):
    """Two workers, rank ``slow_rank`` 50x slower; round 1 ends with both "ready". The slow
    device asks first, with its probe, before the fast one is timed: it is judged at its
    first "ready" (its probe and its iteration)."""
    clock = FakeClock()
    job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock,
                   sizing=RoundSizing(sit_out=ratio))
    fast = 1 - slow_rank
    job.decide(slow_rank, 0, SLOW_C, t=1)
    job.decide(fast, 1, FAST_C, t=1)
    clock.advance(SLOW_C)
    slow_ready = job.decide(slow_rank, 1, SLOW_C, t=1)
    fast_ready = job.decide(fast, 50, FAST_C, t=1)
    assert slow_ready.ready and fast_ready.ready
    assert not fast_ready.sit_out
    return job, clock, slow_ready


def _fast_iterations_until_ready(job, clock, fast=0, t=2, limit=200) -> int:
    for k in range(1, limit + 1):
        clock.advance(FAST_C)
        if job.decide(fast, k, FAST_C, t=t if k == 1 else None).ready:
            return k
    return limit + 1


def test_the_slow_devices_ready_tells_it_to_sit_out():
    _, _, slow_ready = _after_round_one()
    assert slow_ready.sit_out


def test_rank_0_may_sit_out_too():
    # It still follows every exchange, so it still writes the checkpoints once per round.
    _, _, slow_ready = _after_round_one(slow_rank=0)
    assert slow_ready.sit_out


def test_without_the_rule_nobody_is_told_to_sit_out():
    _, _, slow_ready = _after_round_one(ratio=0.0)
    assert not slow_ready.sit_out


def test_a_device_timed_by_its_warm_up_sits_out_before_its_first_iteration():
    clock = FakeClock()
    job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock,
                   sizing=RoundSizing(sit_out=RATIO))
    job.decide(0, 0, FAST_C, t=1)                  # first questions: the warm-up's c
    answer = job.decide(1, 0, SLOW_C, t=1)
    assert answer.ready and answer.sit_out
    # The fast device's round 1 ends after its bounded round, not after a x50 iteration.
    assert _fast_iterations_until_ready(job, clock, t=1) == BOUNDED_ROUND_ITERATIONS


def test_a_warm_up_probe_is_judged_against_the_others_probes_not_their_iterations():
    # A probe on a fraction of a batch, scaled up, overstates a step that is partly fixed
    # cost: here 4x on both devices. A x10 device's probe (4.0) is 40x the fast device's real
    # iterations (0.1) but 10x its probe (0.4): it is waited for; a x50 device's probe is 50x.
    for slow_probe, sits_out in ((10 * 0.4, False), (50 * 0.4, True)):
        clock = FakeClock()
        job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock,
                       sizing=RoundSizing(sit_out=RATIO * 2))
        job.decide(0, 0, 0.4, t=1)                 # the fast device's probe, then iterations
        for k in range(1, 6):
            clock.advance(FAST_C)
            job.decide(0, k, FAST_C)
        answer = job.decide(1, 0, slow_probe, t=1)
        assert answer.sit_out is sits_out, slow_probe
        assert answer.ready is sits_out


def test_a_device_is_not_judged_at_k_0_while_no_faster_device_is_timed():
    clock = FakeClock()
    job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock,
                   sizing=RoundSizing(sit_out=RATIO))
    assert not job.decide(1, 0, SLOW_C, t=1).ready


def test_a_slow_devices_warm_up_judges_it_while_the_other_slow_device_is_untimed():
    # Two devices at the gap probe at once: the first to ask must not compute a x50 iteration
    # because the second has not asked yet (an untimed device can only make the fastest faster).
    clock = FakeClock()
    job = JobState(num_workers=3, epsilon=0.0, policy="dynamic", clock=clock,
                   sizing=RoundSizing(sit_out=RATIO))
    job.decide(0, 0, FAST_C, t=1)
    answer = job.decide(1, 0, SLOW_C, t=1)
    assert answer.ready and answer.sit_out


def test_one_stalled_iteration_does_not_make_a_device_sit_out():
    # A x4 device (one iteration a round) whose round-2 iteration stalls to 77x the fast
    # device's (a loaded host): the smaller of its latest two timings is 4x, so it is waited
    # for; stalled in rounds 2 and 3, it sits out. By its latest c alone the one stall dropped
    # it for good.
    for stalled_rounds, sits_out in (({2}, False), ({2, 3}, True)):
        clock = FakeClock()
        job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock,
                       sizing=RoundSizing(sit_out=RATIO * 2))
        job.decide(0, 0, FAST_C, t=1)
        job.decide(1, 0, 4 * FAST_C, t=1)              # the probes: 4x, waited for
        told, c = [], 4 * FAST_C
        for t in (1, 2, 3):
            if t > 1:
                job.decide(1, 0, c, t=t)               # a round's first question: the last c
            c = 77 * FAST_C if t in stalled_rounds else 4 * FAST_C
            clock.advance(c)
            answer = job.decide(1, 1, c, t=None if t == 1 else t)
            assert answer.ready
            told.append(answer.sit_out)
            _fast_iterations_until_ready(job, clock, t=t)
        assert told[-1] is sits_out and not any(told[:-1]), (stalled_rounds, told)


def test_a_device_without_a_probe_is_judged_only_after_two_iterations():
    clock = FakeClock()
    job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock,
                   sizing=RoundSizing(sit_out=RATIO))
    job.decide(0, 1, FAST_C, t=1)
    job.decide(1, 0, 0.0, t=1)                         # no probe (c = 0: never timed)
    clock.advance(SLOW_C)
    first = job.decide(1, 1, SLOW_C)
    assert first.ready and not first.sit_out           # one reading: it is waited for
    job.decide(0, 50, FAST_C)
    job.decide(1, 0, SLOW_C, t=2)
    clock.advance(SLOW_C)
    assert job.decide(1, 1, SLOW_C).sit_out            # two readings, both 50x


def test_a_device_that_sits_out_is_ready_at_once_in_every_later_round():
    job, clock, _ = _after_round_one()
    for t in (2, 3, 4):
        answer = job.decide(1, 0, SLOW_C, t=t)
        assert answer.ready and answer.sit_out
        _fast_iterations_until_ready(job, clock, t=t)


def test_while_a_device_sits_out_the_fast_one_stops_after_a_bounded_round():
    job, clock, _ = _after_round_one()
    job.decide(1, 0, SLOW_C, t=2)
    assert _fast_iterations_until_ready(job, clock) == BOUNDED_ROUND_ITERATIONS


def test_the_fast_one_does_not_wait_for_the_device_to_enter_the_round():
    # A capped slow device may enter its next round seconds after the others.
    job, clock, _ = _after_round_one()
    assert _fast_iterations_until_ready(job, clock) == BOUNDED_ROUND_ITERATIONS


def test_without_the_rule_the_fast_one_computes_through_the_slow_iteration():
    job, clock, _ = _after_round_one(ratio=0.0)
    job.decide(1, 0, SLOW_C, t=2)
    assert _fast_iterations_until_ready(job, clock) >= 0.8 * SLOW_C / FAST_C


def test_the_last_device_that_computes_never_sits_out():
    # The device that sits out keeps its old c; if the other one then slows down past 16 times
    # that c, it still computes (someone has to).
    job, clock, _ = _after_round_one()
    job.decide(1, 0, SLOW_C, t=2)
    for k in range(1, 20):
        clock.advance(100.0)
        answer = job.decide(0, k, 100.0, t=2 if k == 1 else None)
        if answer.ready:
            break
    assert answer.ready and not answer.sit_out


def test_the_state_shows_who_sits_out_and_survives_a_restart():
    job, clock, _ = _after_round_one()
    job.decide(1, 0, SLOW_C, t=2)
    assert job.snapshot()["workers"][1].get("sits_out") is True
    assert "sits_out" not in job.snapshot()["workers"][0]
    rebuilt = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock,
                       sizing=RoundSizing(sit_out=RATIO))
    rebuilt.restore(dict(enumerate(job.worker_states())))
    answer = rebuilt.decide(1, 0, SLOW_C, t=3)
    assert answer.ready and answer.sit_out


def test_two_slow_devices_sit_out_and_the_fast_one_computes_on():
    clock = FakeClock()
    job = JobState(num_workers=3, epsilon=0.0, policy="dynamic", clock=clock,
                   sizing=RoundSizing(sit_out=RATIO))
    job.decide(1, 0, SLOW_C, t=1)                         # probes, before rank 0 is timed
    job.decide(2, 0, SLOW_C, t=1)
    job.decide(0, 1, FAST_C, t=1)
    clock.advance(SLOW_C)
    assert job.decide(1, 1, SLOW_C, t=1).sit_out
    assert job.decide(2, 1, SLOW_C, t=1).sit_out
    fast = job.decide(0, 50, FAST_C, t=1)
    assert fast.ready and not fast.sit_out


# -- the worker's side --------------------------------------------------------------------------

class _Answers:
    """Stands in for the StateClient's ``decide``: records each question, answers from a list."""

    def __init__(self, *answers):
        self.answers, self.asked = list(answers), []

    def decide(self, rank, k, c, t, d):
        self.asked.append((k, t))
        return self.answers.pop(0)


def test_a_worker_told_to_sit_out_asks_at_k_0_and_computes_nothing():
    answers = _Answers(Decision(False), Decision(True, sit_out=True),
                       Decision(True, sit_out=True))
    asker = ReadinessAsker(answers, 1, clock=FakeClock())
    assert asker.continue_local(0, SLOW_C, 1)                 # round 1: it computes
    assert not asker.continue_local(1, SLOW_C, 1)             # its "ready" says: sit out
    assert asker.sitting_out
    assert not asker.continue_local(0, SLOW_C, 2)             # round 2: nothing to compute
    assert answers.asked == [(0, 1), (1, 1), (0, 2)]


def test_a_worker_that_sits_out_waits_for_its_k_0_answer_instead_of_sending_it_ahead():
    sent = []
    answers = _Answers(Decision(True, sit_out=True), Decision(True, sit_out=True))
    asker = ReadinessAsker(answers, 1, clock=FakeClock(),
                           submit=lambda *call: sent.append(call), may_sit_out=True)
    assert not asker.continue_local(0, SLOW_C, 1)            # judged by its warm-up's c
    assert asker.sitting_out
    assert not asker.continue_local(0, SLOW_C, 2)
    assert sent == [] and answers.asked == [(0, 1), (0, 2)]


# -- on a real cluster ----------------------------------------------------------------------------

def test_a_device_50_times_slower_sits_out_and_the_fast_rounds_last_8_iterations(tmp_path, fashion_data_dir):
    # The launcher's defaults (weighted deltas, carry, --sit-out-ratio 32); sleeping makes the
    # gap exactly 50 whatever the machine's load.
    run_cluster(tmp_path, fashion_data_dir, "--workers", "2", "--slowdown", "1,50",
                "--emulation", "sleep", "-b", "8", "--max-rounds", "12", "--no-evaluator",
                "-e", "1")
    logs = device_logs(tmp_path / "lenet" / "esync")
    fast, slow = logs["cpu0"], logs["cpu1"]
    assert len(fast) == len(slow) == 12
    # Timed by its warm-up step (its first question carries it), it computes nothing at all; on
    # a loaded machine the fast device's first c (its graph built for the whole batch) can
    # hide the gap until a round later, so at most one iteration in each of rounds 1 and 2.
    ks = [r["k"] for r in slow]
    assert ks[2:] == [0] * 10 and max(ks[:2]) <= 1, ks
    assert all(r["num_samples"] == 0 for r in slow[2:])
    # The fast device's rounds last 8 of its own iterations, not one iteration of the x50
    # device (about 50 of its own). Those it carried through the exchange before (a round's
    # "carried_iterations": into the next) count; its lease, counted in its last iteration's
    # time, runs over by a few when iterations speed up under a changing load.
    per_round = [r["k"] + before["carried_iterations"] for before, r in zip(fast[2:], fast[3:])]
    assert 8 <= np.median(per_round) <= 25, per_round
    assert processes_mentioning(str(tmp_path)) == []
