"""esync.coordination.client.ReadinessAsker: the dynamic policy's questions as workers ask them, run
against the real decision logic (esync.coordination.job.JobState) on one simulated clock."""
from esync.coordination.rules import Decision
from esync.coordination.job import JobState
from esync.coordination.client import ReadinessAsker


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class InProcessServer:
    """The state server's decision for one worker, without HTTP; counts the calls."""

    def __init__(self, job: JobState):
        self.job, self.calls = job, []

    def decide(self, rank, k, c, t, d=None):
        self.calls.append((rank, k, t))
        return self.job.decide(rank, k, c, t)


def run_round(clock, job, workers, t):
    """Every worker of ``workers`` ({rank: (asker, c)}) runs round t, in time order; their k.

    The slowest-first order of equal start times is how the exchange releases them at once."""
    state = {rank: {"k": 0, "free_at": clock.now, "done": False} for rank in workers}
    start = clock.now
    while not all(s["done"] for s in state.values()):
        rank = min((r for r in state if not state[r]["done"]),
                   key=lambda r: (state[r]["free_at"], -workers[r][1]))
        clock.now = state[rank]["free_at"]
        asker, c = workers[rank]
        last_c = c if (t > 1 or state[rank]["k"]) else 0.0
        if asker.continue_local(state[rank]["k"], last_c, t):
            state[rank]["k"] += 1
            state[rank]["free_at"] = clock.now + c
        else:
            state[rank]["done"] = True
    clock.now = max(s["free_at"] for s in state.values())
    assert clock.now >= start
    return {rank: s["k"] for rank, s in state.items()}


def simulated_cluster(durations):
    """A clock, the real decision logic behind an in-process server, and one asker per worker
    ({rank: (asker, c)}) for ``durations`` ({rank: c})."""
    clock = Clock()
    job = JobState(num_workers=len(durations), epsilon=0.0, policy="dynamic", clock=clock)
    server = InProcessServer(job)
    workers = {r: (ReadinessAsker(server, r, clock=clock), c) for r, c in durations.items()}
    return clock, job, server, workers


def test_fast_workers_ask_twice_a_round_and_do_what_fits():
    durations = {0: 0.01, 1: 0.15, 2: 0.05}
    clock, job, server, workers = simulated_cluster(durations)
    for t in range(1, 6):
        server.calls.clear()
        ks = run_round(clock, job, workers, t)
    assert ks == {0: 15, 1: 1, 2: 3}
    calls = {r: sum(1 for call in server.calls if call[0] == r) for r in durations}
    assert calls == {0: 2, 1: 2, 2: 2}
    # The fast ones skipped k = 0: their first call of the round is at k = 1 and enters it.
    first = {r: next(call for call in server.calls if call[0] == r) for r in durations}
    assert first == {0: (0, 1, 5), 1: (1, 0, 5), 2: (2, 1, 5)}


def test_a_worker_that_ran_once_asks_before_computing_and_round_one_asks_everyone():
    clock = Clock()
    job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock)
    server = InProcessServer(job)
    fast, slow = (ReadinessAsker(server, r, clock=clock) for r in (0, 1))
    assert fast.continue_local(0, 0.0, 1) and slow.continue_local(0, 0.0, 1)
    assert [call[1] for call in server.calls] == [0, 0]


def test_without_a_lease_it_asks_before_every_iteration():
    """An older server (no budget in its answer): the original protocol, one call a step."""

    class OldServer(InProcessServer):
        def decide(self, rank, k, c, t, d=None):
            self.calls.append((rank, k, t))
            return Decision(self.job.decide(rank, k, c, t).ready)

    clock = Clock()
    job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock)
    server = OldServer(job)
    workers = {r: (ReadinessAsker(server, r, clock=clock), c) for r, c in ((0, 0.01), (1, 0.1))}
    for t in (1, 2, 3):
        server.calls.clear()
        ks = run_round(clock, job, workers, t)
    assert ks[0] >= 8 and sum(1 for call in server.calls if call[0] == 0) >= ks[0]


def test_the_lease_counts_from_the_answer_not_from_the_question():
    """Under load a call waits in the server's queue before it is decided; the budget is
    computed then, so a lease counted from the question would end early by that wait (and
    cost the fast worker iterations and a call)."""

    class QueuedServer:
        def __init__(self, clock, queue, budget):
            self.clock, self.queue, self.budget, self.calls = clock, queue, budget, 0

        def decide(self, rank, k, c, t, d=None):
            self.calls += 1
            self.clock.now += self.queue                  # waiting behind other workers' calls
            return Decision(False, self.budget)

    clock = Clock()
    server = QueuedServer(clock, queue=0.02, budget=0.1)
    asker = ReadinessAsker(server, 0, clock=clock)
    asked = clock.now
    assert asker.continue_local(0, 0.0, 1) and server.calls == 1
    # Iterations of 10 ms that end within 100 ms of the answer (20 ms after the question).
    for k in range(1, 10):
        clock.now = asked + 0.02 + (k - 1) * 0.01 + 0.01
        assert asker.continue_local(k, 0.01, 1)
    assert server.calls == 1
    clock.now = asked + 0.02 + 0.095                  # the next one would end after the lease
    asker.continue_local(10, 0.01, 1)
    assert server.calls == 2


def test_every_question_leaves_through_the_given_caller():
    """ESync hands the asker a caller that runs each question on a thread outside the device's
    CPU cap; every question, and only questions, must go through it, answers unchanged."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    clock = Clock()
    job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock)
    server = InProcessServer(job)
    threads = []
    with ThreadPoolExecutor(1) as pool:
        def call(fn, *args):
            threads.append(pool.submit(threading.get_ident).result())
            return pool.submit(fn, *args).result()
        workers = {0: (ReadinessAsker(server, 0, clock=clock, call=call), 0.01),
                   1: (ReadinessAsker(server, 1, clock=clock, call=call), 0.05)}
        for t in range(1, 4):
            ks = run_round(clock, job, workers, t)
    assert ks == {0: 5, 1: 1}
    assert len(threads) == len(server.calls) > 0
    assert set(threads) == {threads[0]} and threads[0] != threading.get_ident()


def test_a_ready_worker_keeps_what_the_slowest_still_computes_and_the_slowest_keeps_nothing():
    """``wait`` decides who carries iterations through the exchange (--carry): the fast workers
    are told the rest of the slowest's iteration, the slowest is told 0."""
    clock, job, _, workers = simulated_cluster({0: 0.01, 1: 0.15, 2: 0.04})
    for t in range(1, 4):
        run_round(clock, job, workers, t)
    waits = {r: asker.wait for r, (asker, _) in workers.items()}
    assert waits[1] == 0.0
    assert 0.0 < waits[0] <= 0.01 and 0.0 < waits[2] <= 0.04, waits


def test_an_answer_without_a_valid_wait_or_budget_counts_as_zero():
    from esync.coordination.client import _seconds
    assert _seconds({"ready": 1}, "wait") == 0.0                     # an older server
    for bad in (True, -1.0, float("nan"), float("inf"), "0.2", None):
        assert _seconds({"wait": bad}, "wait") == 0.0, bad
    assert _seconds({"budget": 0.25}, "budget") == 0.25


class HeldAnswers:
    """``submit`` as ESync's questions thread gives it, with the answers held back until the
    test releases them: what a worker does while its question travels."""

    def __init__(self):
        from concurrent.futures import Future
        self.Future, self.held = Future, []

    def __call__(self, fn, *args):
        future = self.Future()
        self.held.append((future, fn, args))
        return future

    def release(self):
        for future, fn, args in self.held:
            try:
                future.set_result(fn(*args))
            except Exception as exc:           # noqa: BLE001 - handed to the asker
                future.set_exception(exc)
        self.held.clear()


def test_the_slowest_computes_while_its_first_question_travels():
    clock = Clock()
    job = JobState(num_workers=2, epsilon=0.0, policy="dynamic", clock=clock)
    server = InProcessServer(job)
    held = HeldAnswers()
    slow = ReadinessAsker(server, 1, clock=clock, submit=held)
    fast = ReadinessAsker(server, 0, clock=clock)
    assert slow.continue_local(0, 0.0, 1)             # computes with its question unanswered
    assert server.calls == [] and len(held.held) == 1
    clock.now += 0.002                                # the question's transit
    held.release()
    assert server.calls == [(1, 0, 1)]                # it entered round 1 on arrival
    assert fast.continue_local(0, 0.0, 1)
    clock.now += 0.01
    assert fast.continue_local(1, 0.01, 1)            # the slow one is not timed yet
    clock.now += 0.09
    assert not slow.continue_local(1, 0.1, 1)         # ready after its iteration: waited for
    assert held.held == [] and server.calls[-1] == (1, 1, 1)


def test_rounds_are_the_same_with_first_questions_sent_without_waiting():
    """Answers that arrive at once: the same k_i and the same calls as when waiting for them."""
    def rounds(submit):
        clock, job, server, workers = simulated_cluster({0: 0.01, 1: 0.15, 2: 0.05})
        if submit:
            def send(fn, *args):
                from concurrent.futures import Future
                future = Future()
                future.set_result(fn(*args))
                return future
            for asker, _ in workers.values():
                asker.submit = send
        ks = [run_round(clock, job, workers, t) for t in range(1, 6)]
        return ks, server.calls

    assert rounds(True) == rounds(False)


def test_a_lease_from_an_answer_taken_later_counts_from_its_arrival():
    class Budget(InProcessServer):
        def decide(self, rank, k, c, t, d=None):
            self.calls.append((rank, k, t))
            return Decision(False, 0.1)

    clock = Clock()
    server, held = Budget(None), HeldAnswers()
    asker = ReadinessAsker(server, 0, clock=clock, submit=held)
    assert asker.continue_local(0, 0.0, 1)
    clock.now += 0.02
    held.release()                                     # arrives at 1000.02: lease to 1000.12
    clock.now += 0.05
    assert asker.continue_local(1, 0.04, 1) and len(server.calls) == 1    # ends by 1000.11
    clock.now += 0.04
    assert asker.continue_local(2, 0.04, 1) and len(server.calls) == 2    # 1000.15: asks


def test_a_failed_first_question_is_raised_in_the_training_thread():
    import pytest
    from esync.coordination.client import StateServerError

    class Refusing(InProcessServer):
        def decide(self, rank, k, c, t, d=None):
            raise StateServerError("refused")

    held = HeldAnswers()
    asker = ReadinessAsker(Refusing(None), 0, clock=Clock(), submit=held)
    assert asker.continue_local(0, 0.0, 1)
    held.release()
    with pytest.raises(StateServerError, match="refused"):
        asker.continue_local(1, 0.01, 1)


def test_the_slowest_carrying_enters_its_next_round_when_its_carried_iteration_starts():
    """--carry-slowest: the slowest's carried iteration is its next round's first, begun at its
    push. Told so then (``begin_next_round``), the server gives a fast worker a lease that ends
    with that iteration; asked only when it has ended, the server took the slowest as not yet
    started and gave a whole round's lease, so the fast worker pushed up to an iteration late
    and the slowest carried a second one."""
    def fast_lease_after_push(early: bool) -> float:
        clock, job, server, workers = simulated_cluster({0: 0.01, 1: 0.1})
        for t in (1, 2):
            run_round(clock, job, workers, t)
        (fast, _), (slow, _) = workers[0], workers[1]
        held = HeldAnswers()
        slow.submit = held
        pushed = clock.now                    # both ready: round 2's exchange is under way
        if early:
            slow.begin_next_round(3, 0.1)     # its carried iteration starts now
            assert server.calls[-1:] != [(1, 0, 3)] and len(held.held) == 1   # not waited for
            clock.now += 0.001
            held.release()
            assert server.calls[-1] == (1, 0, 3)
        clock.now = pushed + 0.02 + 0.01      # the sums arrive, the fast runs one iteration
        assert fast.continue_local(1, 0.01, 3)
        clock.now = pushed + 0.1              # the slowest's carried iteration ends: ready
        assert not slow.continue_local(1, 0.1, 3)
        return fast.lease_ends - pushed

    assert fast_lease_after_push(early=True) <= 0.1 + 0.002     # the question's transit
    assert fast_lease_after_push(early=False) > 0.1 + 0.029     # a whole round from its question
