"""What the state server accepts: the policies, the limits of every field, and the errors.

Anything beyond a limit is a client bug, rejected (``PolicyError`` naming the field) before it
touches a job's state; the Django views turn the error into a 4xx.
"""
from __future__ import annotations

import math

POLICIES = ("dynamic", "planned")
AUTO = "auto"

# Limits of accepted values: anything beyond is a client bug, rejected before it touches state.
MAX_WORKERS = 4096
MAX_K = 10_000_000          # local iterations in one round
MAX_C = 86_400.0            # seconds per local iteration
MAX_ROUND = 1_000_000_000
MAX_EPSILON = 3_600.0       # seconds of absolute slack
MAX_PLANNED_K = 1_000_000   # cap on a planned k (c_s / c_i with a near-zero c_i)
OVERHEAD_SMOOTHING = 0.25   # weight of the newest sample in the overhead moving average
HISTORY_IN_MEMORY = 10_000  # records kept in memory per job (the state server also persists them)

ERR_NUM_WORKERS = f"num_workers must be an integer in [1, {MAX_WORKERS}]"
ERR_EPSILON = f"epsilon must be 'auto' or a number of seconds in [0, {MAX_EPSILON:g}]"
ERR_POLICY = "policy must be one of: " + ", ".join(POLICIES)
ERR_RANK = "r (the worker's rank) must be an integer in [0, {num_workers})"
ERR_K = f"k (local iterations done this round) must be an integer in [0, {MAX_K}]"
ERR_C = f"c (duration of the last local iteration) must be a number of seconds in [0, {MAX_C:g}]"
ERR_ROUND = f"t (the round entered) must be an integer in [1, {MAX_ROUND}]"
ERR_WRONG_POLICY_APPLY = "this job uses the 'planned' policy: call plan, not apply"
ERR_WRONG_POLICY_PLAN = "this job uses the 'dynamic' policy: call apply, not plan"
ERR_WRONG_POLICY_ROUNDS = ("this job uses the 'dynamic' policy: report rounds only on a job "
                           "initialised with policy 'planned'")
ERR_ROUND_K = ("k must be a list of num_workers ({num_workers}) integers in [0, "
               f"{MAX_K}]: the local iterations of every worker in round t")
ERR_ROUND_C = ("c must be a list of num_workers ({num_workers}) numbers of seconds in [0, "
               f"{MAX_C:g}]: every worker's last local-iteration duration in round t")
MAX_BATCH = 64              # round reports in one call (a reporter catching up)
ERR_BATCH = f"rounds must be a list of 1 to {MAX_BATCH} objects {{t, k, c}}"
MAX_COMM = 86_400.0         # seconds of one round's communication
MAX_ROUND_SECONDS = 3_600.0  # the longest bound on a round's duration a job accepts
COMM_SMOOTHING = 0.5        # weight of the newest round in the communication-time average
ERR_COMM_SHARE = "comm_share must be a number in (0, 1]: the largest share of a round " \
                 "communication may take (1: rounds sized by compute alone)"
ERR_MAX_ROUND = f"max_round must be a number of seconds in [0, {MAX_ROUND_SECONDS:g}] (0: no bound)"
ERR_OVERLAP = "overlap must be true or false"
MIN_SIT_OUT, MAX_SIT_OUT = 2.0, 1e6   # the ratios a job accepts for devices that sit out
ERR_SIT_OUT = (f"sit_out must be 0 (every device is waited for) or a ratio in [{MIN_SIT_OUT:g}, "
               f"{MAX_SIT_OUT:g}]: a device whose iteration exceeds that many of the fastest "
               "device's sits out the rounds")
ERR_D = (f"d (the worker's communication time of its last round) must be a number of seconds "
         f"in [0, {MAX_COMM:g}]")
ERR_ROUND_D = ("d must be a list of num_workers ({num_workers}) numbers of seconds in [0, "
               f"{MAX_COMM:g}]: every worker's communication time in round t")
ERR_ROUND_O = ("o must be a list of num_workers ({num_workers}) numbers of seconds in [0, "
               f"{MAX_COMM:g}]: the time every worker's aggregation of round t computed")
PLANS_KEPT = 64             # answered plans remembered per job, to answer a repeated report

PERSISTED_FIELDS = ("round", "k", "c", "ready", "planned_k", "overhead", "round_k",
                    "round_compute", "sit_out_from")


class PolicyError(ValueError):
    """A rejected call; ``field`` names the offending input. State is unchanged."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.message = message
        self.field = field


class PolicyMismatch(PolicyError):
    """``apply`` on a planned job or ``plan`` on a dynamic one."""


def check_int(value, *, low: int, high: int, message: str, field: str) -> int:
    """``value`` as an int in [low, high], or PolicyError (bools are not integers)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PolicyError(message, field)
    return value


def check_float(value, *, low: float, high: float, message: str, field: str) -> float:
    """``value`` as a finite float in [low, high], or PolicyError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(message, field)
    try:
        value = float(value)
    except OverflowError:                                 # an integer too large for a float
        raise PolicyError(message, field) from None
    if not math.isfinite(value) or not low <= value <= high:
        raise PolicyError(message, field)
    return value


def check_epsilon(value) -> float | str:
    """``"auto"`` or absolute seconds."""
    if value == AUTO:
        return AUTO
    return check_float(value, low=0.0, high=MAX_EPSILON, message=ERR_EPSILON, field="epsilon")


def check_policy(value) -> str:
    if value not in POLICIES:
        raise PolicyError(ERR_POLICY, "policy")
    return value


def check_sizing(comm_share, max_round, overlap,
                 sit_out=0.0) -> tuple[float, float, bool, float]:
    """The round-sizing settings of a job (``esync.coordination.rules.round_length``)."""
    share = check_float(comm_share, low=0.0, high=1.0, message=ERR_COMM_SHARE, field="comm_share")
    if share <= 0:
        raise PolicyError(ERR_COMM_SHARE, "comm_share")
    bound = check_float(max_round, low=0.0, high=MAX_ROUND_SECONDS, message=ERR_MAX_ROUND,
                        field="max_round")
    if not isinstance(overlap, bool):
        raise PolicyError(ERR_OVERLAP, "overlap")
    ratio = check_float(sit_out, low=0.0, high=MAX_SIT_OUT, message=ERR_SIT_OUT,
                        field="sit_out")
    if 0 < ratio < MIN_SIT_OUT:
        raise PolicyError(ERR_SIT_OUT, "sit_out")
    return share, bound, overlap, ratio
