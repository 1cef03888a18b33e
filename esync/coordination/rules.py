"""The ESync state server's decisions: how long each worker keeps computing locally in a round.

Plain Python with an injected clock, so every branch is testable without HTTP; the Django views
of ``state_server/`` only parse, validate, call this module and serialise (see
``docs/ALGORITHM.md``).

Two policies, chosen per job at ``init``:

``dynamic`` (the original ESync, one request before every local iteration)
    ``JobState.apply(rank, k, c)`` follows the pseudo-code: record ``k_i``, ``c_i`` and
    ``seen_i`` (the *server's* receive time; worker timestamps are never used, so clocks need not
    agree), then answer "not ready" when ``k_i == 0`` or when the slowest worker ``s`` (largest
    ``c``) has not started the current round, and "ready" when ``i == s``, when ``s`` is already
    ready, or when ``c_i + slack_i > remaining`` with ``remaining = c_s - (now - seen_s)``.
    "Has not started" also covers a slowest worker that entered the round but has not reported in
    it yet: its ``seen`` then dates from the previous round and ``remaining`` would be meaningless
    (unless it is already ready: after a restart it will not report again in this round).

    The lease (``JobState.decide``): a "not ready" answer also says for how long the rule will
    keep saying it, ``budget = remaining - slack_i`` (before the slowest has started, its whole
    last ``c_s`` minus the slack: it starts after now). Any iteration the worker starts within
    ``budget - c_i`` of the answer would be told "not ready", so the trainer does not ask for
    it; it asks when the lease runs out, and the server, not the worker, says "ready". A fast
    worker asks twice per round (after its first iteration, which also enters the round, and
    once at the end) instead of before each iteration (``esync.coordination.client.ReadinessAsker``).
    The worker counts the lease from the answer's arrival (the budget was computed after the
    call's wait in the server's queue, which under load is most of a call), so a lease is too
    long for the rule as it stood by at most the answer's transit back; a worker that may be the
    slowest computes while its k = 0 question travels, so the server's clock for its iteration
    starts late by that question's transit: the others' leases are then long by as much, and
    the slowest waits for them at most that long at the exchange (a millisecond or two, against
    the round trip, and on a throttled emulated device the rest of a CFS period, that waiting
    for the answer cost it).

    The wait: a "ready" answer also says what is left of the slowest's round by the server's
    clock (``Decision.wait``, ``remaining`` above; 0 for the slowest itself and once it is
    ready): the time this worker would idle at the exchange, which ``--carry`` spends computing.

    Devices that sit out (``sitting_out_ranks``, on a job whose workers support it:
    ``RoundSizing.sit_out``): a device whose iteration exceeds ``sit_out`` times the fastest
    timed one's is told so with its "ready" (``Decision.sit_out``): at its first question (its
    warm-up's c) it sits out that very round, at a round's first "ready" from its next one.
    From then on it is left out of ``s``, is "ready" at once
    (k = 0) in every round, and the rounds last ``bounded_length``; it never comes back.

``planned`` (new: one request per worker per round)
    ``JobState.plan(rank, c)`` is called once at the start of a round and returns
    ``k_i = max(1, floor((c_s - slack_i) / c_i))`` from the latest known ``c`` of every worker;
    the slowest worker itself, and everyone while some worker's ``c`` is still unknown, get 1.

The slack
---------
A number given at ``init`` is the original's absolute ``epsilon`` in seconds, unchanged (the
original's default was 0.5 s, which turns ESync into SSGD as soon as an iteration takes less than
0.5 s: ``c_i + 0.5 > remaining`` always holds).

The default, ``"auto"``, is scale-free::

    slack_i = (o_i - o_s) - c_i / N

``o_i`` is worker i's *per-iteration overhead*, measured on the server's own clock: between two
consecutive reports of one round (``k`` going up by one) the worker spent ``now - seen_i``, of
which ``c`` was the iteration it reports, so ``o = max(0, now - seen_i - c)`` (request round trip,
batch loading, anything outside ``c``); it is smoothed with an exponential moving average.
Why these two terms:

* Overheads.  Worker i, told "not ready" now, reports again at ``now + c_i + o_i``; the slowest
  reports its finished iteration at ``seen_s + c_s + o_s``.  Aggregation starts when both have
  reported, so one more iteration fits iff ``c_i + o_i - o_s <= remaining``.  On a uniform network
  the overheads cancel; a worker on a slower link (or with slower batch loading) stops earlier.
* ``- c_i / N``.  Timings are noisy, so the last iteration that "fits" may overshoot a little.
  Stopping early idles one worker for (up to) ``c_i``; overshooting by ``x`` idles the other
  ``N - 1`` workers for ``x``.  One more iteration pays off iff ``(N - 1) x < c_i - x``, i.e.
  ``x < c_i / N``: so a predicted overshoot below ``c_i / N`` is accepted.  With the planned
  policy this makes ``k_i = floor(c_s / c_i + 1 / N)``: a worker measured 1.97 times faster than
  the slowest does 2 iterations, not 1 (plain flooring would waste half its time on noise).

Both terms scale with the iteration time and the measured latency, so the rule behaves the same
for 5 ms and 5 s iterations.  Overheads are only measurable from per-iteration reports, so under
the planned policy they are 0 unless the worker also reported per iteration.

One report per round (``JobState.report_round``, the planned policy without HTTP on the
critical path)
    After round t's parameter exchange, rank 0 reports every worker's ``k`` and ``c`` of round t in
    one call and gets back the plan of every worker for the next round it can influence.  The plan
    is ``plan_round``, the same pure function ``plan`` uses, so both give the same ``k_i`` for the
    same durations.

The limits of accepted values and the errors live in ``esync.coordination.limits``; the job's
bookkeeping (rounds, history, persistence) in ``esync.coordination.job``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from esync.common.esync_parts import BOUNDED_ROUND_ITERATIONS, bounded_length  # noqa: F401
from esync.coordination.limits import AUTO, MAX_PLANNED_K


# -- the planned policy as pure functions (shared by ``plan`` and ``report_round``) ----------------

def slowest_rank(durations) -> int:
    """Rank with the largest duration (lowest rank on ties)."""
    best = 0
    for rank, c in enumerate(durations):
        if c > durations[best]:
            best = rank
    return best


def steady_slowest_rank(durations, earlier=None) -> int | None:
    """The slowest rank, each read as the smaller of its latest two ``durations`` (``earlier``:
    the exchange before; a 0 there is no timing), so that one stalled iteration does not make
    a device the slowest. None with one rank or an untimed one (a 0 in ``durations``)."""
    if len(durations) < 2 or not all(c > 0 for c in durations):
        return None
    if earlier is not None:
        durations = [min(now, then) if then > 0 else now for now, then in zip(durations, earlier)]
    return slowest_rank(durations)


def slack_of(epsilon: float | str, *, c_i: float, num_workers: int, overhead_i: float = 0.0,
             overhead_s: float = 0.0) -> float:
    """Worker i's slack: absolute ``epsilon``, or the module docstring's automatic slack."""
    if epsilon != AUTO:
        return epsilon
    return (overhead_i - overhead_s) - c_i / num_workers


def planned_k(c_i: float, c_s: float, slack_i: float) -> int:
    """Iterations of duration ``c_i`` that fit in the slowest's ``c_s`` given ``slack_i``."""
    k = math.floor((c_s - slack_i) / c_i + 1e-9)
    return max(1, min(MAX_PLANNED_K, k))


# A device that has slowed down within a round (another job landed on its machine) stops once
# its round's computing would pass this many times the others' planned computing.
PLANNED_OVERRUN = 1.5


def planned_round_budget(rank: int, plan, durations) -> float:
    """The computing the other workers were planned for in the coming round: the largest
    ``k_j * c_j`` over ``j != rank`` (``plan``: every worker's k, ``durations``: every worker's
    c, both from the last exchange); 0 when unknown (one worker, no plan yet)."""
    return max((k * c for j, (k, c) in enumerate(zip(plan, durations))
                if j != rank and k > 0 and c > 0), default=0.0)


def planned_continue(k: int, planned: int, used: float, last_c: float, budget: float) -> bool:
    """Whether a worker given ``planned`` iterations runs another after ``k`` of them (``used``
    seconds computed in the round, the last took ``last_c``; ``budget``: the others' planned
    computing, ``planned_round_budget``). The plan's count, unless the next iteration would
    end after ``PLANNED_OVERRUN * budget``: a device that has become several times slower within
    the round would otherwise run its whole count at its new speed, and everyone would wait
    ``planned * (new c - old c)`` for it in each round until the plan hears of the change (a
    round or two later): 3 s rounds instead of 0.5 s for a x1 device of the default cluster that
    becomes 6x slower. At steady speeds the count ends within ``budget`` (it is what fits in
    the slowest's time), so the count is what runs."""
    if k >= planned:
        return False
    if k == 0 or budget <= 0:
        return True
    return used + last_c <= PLANNED_OVERRUN * budget


@dataclass(frozen=True)
class RoundSizing:
    """How long a round lasts besides the slowest device's one iteration (``round_length``).

    ``comm_share``: the largest share of a round communication may take (1: sized by compute
    alone, the original ESync); ``max_round``: bound on the round's duration in seconds (0: no
    bound); ``overlap``: the workers exchange in the background while computing the next round;
    ``sit_out``: a device whose iteration exceeds this many of the fastest's sits out the rounds
    (``sitting_out_ranks``; 0: every device is waited for, as the original).
    """
    comm_share: float = 1.0
    max_round: float = 0.0
    overlap: bool = False
    sit_out: float = 0.0

    def as_dict(self) -> dict:
        """The settings (``sit_out`` only when on: a job without it reads as before it existed)."""
        return {"comm_share": self.comm_share, "max_round": self.max_round,
                "overlap": self.overlap, **({"sit_out": self.sit_out} if self.sit_out else {})}


COMPUTE_ONLY = RoundSizing()
OVERLAP_MARGIN = 1.5     # with overlap, a round outlasts the transfer it hides by half (it varies)


def round_length(c_s: float, comm: float, sizing: RoundSizing = COMPUTE_ONLY,
                 overhead: float = 0.0) -> float:
    """The round's duration T: the slowest device's iteration ``c_s``, stretched so that what a
    round spends not computing stays within the share: the transfer ``comm`` (seconds per
    exchange; 0: unknown) and the aggregation's own arithmetic ``overhead`` (seconds per round;
    0: unknown), which no overlap hides.

    Without overlap both follow the computation: their share of a round is
    ``(comm + overhead) / (T + comm + overhead)``, so ``T >= (comm + overhead)(1 - share) /
    share``. With overlap the transfer runs during the next round, which only has to outlast
    it (``T >= OVERLAP_MARGIN * comm``), and the arithmetic alone counts against the share. T
    never goes below ``c_s`` (the slowest device computes at least once) nor above
    ``max(c_s, max_round)``, and a stretched round is a whole number of ``c_s`` (rounded up, or
    down to stay within the bound): the slowest device fills it as every other does.
    """
    comm, overhead = max(0.0, comm), max(0.0, overhead)
    share = sizing.comm_share
    if share >= 1.0 and not sizing.overlap or comm + overhead <= 0:
        return c_s
    exposed = overhead if sizing.overlap else comm + overhead
    wanted = exposed * (1.0 - share) / share if share < 1.0 else 0.0
    if sizing.overlap:
        wanted = max(wanted, OVERLAP_MARGIN * comm)
    if sizing.max_round > 0:
        wanted = min(wanted, sizing.max_round)
    if wanted <= c_s or c_s <= 0:
        return max(c_s, wanted)
    # Whole iterations of the slowest: a round ending within one of them would leave it idle
    # for the rest of the round while the others fill it.
    whole = math.ceil(wanted / c_s - 1e-9)
    if sizing.max_round > 0 and whole * c_s > sizing.max_round + 1e-9:
        whole = math.floor(sizing.max_round / c_s + 1e-9)
    return max(1, whole) * c_s


# -- devices too slow to wait for ---------------------------------------------------------------

def sitting_out_ranks(durations, ratio: float) -> set[int]:
    """The devices not worth waiting for: those whose iteration ``c_i`` exceeds ``ratio``
    times the fastest timed one's (``durations``: every device's latest c; 0: not timed yet,
    and never judged; ``ratio`` 0: nobody). An untimed device can only make the fastest
    faster, so a device judged against the timed ones stays judged once every device is timed:
    a slow device's warm-up judges it before its first iteration, whatever the others' state.

    Waiting for a device of ``c_i = G c_min`` makes every round last G of the fastest device's
    iterations for one of its own: at G = 150 the fast devices' models drift apart for 150 local
    steps between averages and the model moves once every 12-15 s here, while the slow device
    adds well under 1% of the samples. Leaving it out costs that share of the samples and keeps
    the rounds short."""
    known = [c for c in durations if c > 0]
    if ratio <= 0 or not known:
        return set()
    fastest = min(known)
    return {rank for rank, c in enumerate(durations) if c > ratio * fastest}


def transfer_estimate(comms) -> float:
    """One exchange's transfer time from every worker's measured wait (0: unknown): the
    smallest. A worker's wait is the transfer plus the time until the last worker pushed; the
    last one waits for the transfer alone."""
    known = [d for d in comms if d and d > 0]
    return min(known) if known else 0.0


def plan_for(rank: int, durations, *, epsilon: float | str, overheads=None,
             length: float | None = None) -> int:
    """The planned policy's k for ``rank`` given every worker's latest duration (0: unknown)
    and the round's duration ``length`` (None: the slowest's iteration)."""
    if any(c <= 0 for c in durations):
        return 1                                          # someone has never reported a duration
    s = slowest_rank(durations)
    return _plan_rank(rank, s, durations, epsilon=epsilon, overheads=overheads, length=length)


def plan_round(durations, *, epsilon: float | str, overheads=None,
               length: float | None = None) -> list[int]:
    """``plan_for`` of every rank at once (O(N))."""
    if any(c <= 0 for c in durations):
        return [1] * len(durations)
    s = slowest_rank(durations)
    return [_plan_rank(rank, s, durations, epsilon=epsilon, overheads=overheads, length=length)
            for rank in range(len(durations))]


def _plan_rank(rank: int, s: int, durations, *, epsilon, overheads, length) -> int:
    if rank == s and (length is None or length <= durations[s]):
        return 1                                          # a round of one slowest iteration
    overhead_i = (overheads[rank] or 0.0) if overheads else 0.0
    overhead_s = (overheads[s] or 0.0) if overheads else 0.0
    slack = slack_of(epsilon, c_i=durations[rank], num_workers=len(durations),
                     overhead_i=overhead_i, overhead_s=overhead_s)
    target = durations[s] if length is None else max(length, durations[s])
    return planned_k(durations[rank], target, slack)


@dataclass(frozen=True)
class Decision:
    """The dynamic policy's answer. ``budget`` (s) qualifies a "not ready": by the server's
    clock, this worker would keep being told "not ready" for every iteration it starts within
    ``budget - c`` seconds of this answer (as long as no report changes who is the slowest), so
    it need not ask again before then. 0: ask before the next iteration.

    ``wait`` (s) qualifies a "ready": how long the round's slowest worker should still compute
    (its iteration's remainder, by the server's clock), which this worker will wait for at its
    exchange. 0: this worker is the slowest, or the slowest has already finished (while some
    worker has no duration yet, the apparent slowest gets its own ``c``: it may not be). A worker
    with ``--carry`` computes through that wait.

    ``sit_out`` qualifies a "ready": this worker sits out from its next round on
    (``sitting_out_ranks``): it computes nothing, is "ready" at once in every round and pushes
    an empty delta, which the weighted aggregation gives no weight."""
    ready: bool
    budget: float = 0.0
    wait: float = 0.0
    sit_out: bool = False


READY, NOT_READY = Decision(True), Decision(False)
