"""ESync's parts, the flags that choose them, and what each cannot be combined with.

ESync (``esync.worker.algorithms.esync``) is built from five parts, each with a default that no
flag needs to ask for:

    outer step    the aggregation rule alone; with momentum (--outer-momentum, --nesterov) or
                  Adam (--outer-adam)
    wire          float32 deltas; float16 (--comm-dtype float16) or rank-R factors with error
                  feedback (--low-rank R)
    schedule      a blocking exchange; overlapped with the next round (--overlap), or the fast
                  devices computing through it (--carry, --carry-slowest)
    local rule    SGD steps, with FedProx's term (--prox-mu) and SCAFFOLD's correction
                  (--scaffold) if asked; or gradients summed at the round's model (--accumulate)
    round sizing  the state server's answers (--policy dynamic); its plan (--policy planned);
                  or a fixed k (--local-iters)

Each ``Choice`` below is one flag's choice: its option (the argparse dest), its flag, when a value
turns it on, and what excludes it with the fix to give. ``check`` reads these declarations for
``main.py`` and ``esync-cluster``; ``conflict`` lets a preset's value yield to what the user
gave (``esync.cli.preset_excluded``); the worker picks its parts with ``chosen``. This module imports nothing of the worker, so
the launcher and the benchmark can read it.

Settings are any object holding the options as attributes (``argparse.Namespace``, the worker's
``AlgorithmConfig``) or a dict. An option missing or None is unset (a launcher's flags before
its defaults), and an unset value excludes nothing. When several choices are refused, ``check``
names the first in ``CHOICES``' order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from esync.common.errors import UsageError

PARTS = ("outer step", "wire", "schedule", "local rule", "round sizing")


def setting(settings, option: str):
    """The value of ``option`` in ``settings``; None when unset."""
    if isinstance(settings, dict):
        return settings.get(option)
    return getattr(settings, option, None)


@dataclass(frozen=True)
class On:
    """Holds when the choice of ``option`` is on (another part's, or this part's rival)."""
    option: str

    def holds(self, settings) -> bool:
        return is_on(self.option, settings)


@dataclass(frozen=True)
class Off:
    """Holds when ``option`` is set and its choice is off: what a choice needs."""
    option: str

    def holds(self, settings) -> bool:
        return setting(settings, self.option) is not None and not is_on(self.option, settings)


@dataclass(frozen=True)
class Outside:
    """Holds when ``option``, a setting that is no part of ESync (the mode, the collective), is
    set to a value ``excludes`` says no."""
    option: str
    excludes: Callable[[object], bool]

    def holds(self, settings) -> bool:
        value = setting(settings, self.option)
        return value is not None and self.excludes(value)


@dataclass(frozen=True)
class InMode:
    """Holds when ``by`` holds and the mode is ESync (``esync=True``) or another one: a flag
    the other modes read otherwise (--nesterov shapes their --momentum)."""
    by: "On | Off | Outside"
    esync: bool

    def holds(self, settings) -> bool:
        return ((setting(settings, "mode") in (None, "esync")) == self.esync
                and self.by.holds(settings))


@dataclass(frozen=True)
class Exclusion:
    """``by`` holding excludes the choice; ``fix`` says what to change (formatted with the
    settings' values: ``{mode}``, ``{comm_dtype}``)."""
    by: On | Off | Outside | InMode
    fix: str


@dataclass(frozen=True)
class Choice:
    option: str                      # the argparse dest: the key of everything here
    flag: str                        # as the user types it
    part: str                        # one of PARTS
    turns_on: Callable[[object], bool]   # whether a (set) value of the option makes the choice
    off: str                         # the flag that leaves the choice out, for the messages
    excludes: tuple[Exclusion, ...] = ()

    def refusal(self, fix: str) -> str:
        return f"argument {self.flag}: {fix} (or {self.off})"


def _any_fixed(k) -> bool:
    """--local-iters: one K (main.py) or one per worker (esync-cluster); 0: the server decides."""
    return any(k) if isinstance(k, (tuple, list)) else bool(k)


NOT_ESYNC = Outside("mode", lambda mode: mode != "esync")
NOT_PS = Outside("collective", lambda collective: collective != "ps")

# In precedence order within a part (``chosen``), and in the order ``check`` reads them.
CHOICES = (
    Choice("outer_momentum", "--outer-momentum", "outer step", bool, "--outer-momentum 0"),
    Choice("outer_adam", "--outer-adam", "outer step", bool, "--no-outer-adam"),
    # ESync's outer momentum's form; in the other modes their SGD --momentum's.
    Choice("nesterov", "--nesterov", "outer step", bool, "--no-nesterov", (
        Exclusion(InMode(On("outer_adam"), esync=True),
                  "--outer-adam has no Nesterov form (its --outer-momentum is Adam's beta1): "
                  "give --no-outer-adam"),
        Exclusion(InMode(Off("outer_momentum"), esync=True),
                  "it needs an --outer-momentum above 0; give one, as DiLoCo's 0.9"),
        Exclusion(InMode(Outside("momentum", lambda momentum: not momentum), esync=False),
                  "-m {mode}'s Nesterov form is of its --momentum, which is 0; give one, as 0.9"),
        Exclusion(InMode(Outside("use_dcasgd", lambda variant: variant == 2), esync=False),
                  "MXNet's DCASGD optimizer (-dcasgd 2) has no Nesterov form"),
    )),
    Choice("low_rank", "--low-rank", "wire", bool, "--low-rank 0", (
        Exclusion(NOT_ESYNC, "-m {mode} exchanges gradients or weights, not deltas; use -m esync"),
        Exclusion(On("overlap"), "--overlap is not supported with it; give --no-overlap"),
        Exclusion(On("comm_dtype"), "the factors travel as float32 (the arrays left in full are "
                                    "a few percent of the bytes); give --comm-dtype float32"),
        Exclusion(On("scaffold"), "--scaffold's variates would still travel in full; give "
                                  "--no-scaffold"),
        Exclusion(NOT_PS, "it runs over the parameter server; give --collective ps"),
    )),
    Choice("comm_dtype", "--comm-dtype", "wire", lambda dtype: dtype != "float32",
           "--comm-dtype float32", (
        Exclusion(NOT_ESYNC, "{comm_dtype} is the type of ESync's deltas; -m {mode} exchanges "
                             "float32 gradients and weights: use -m esync"),
    )),
    Choice("overlap", "--overlap", "schedule", bool, "--no-overlap"),
    Choice("carry", "--carry", "schedule", bool, "--no-carry", (
        Exclusion(NOT_ESYNC, "-m {mode} has no exchange of deltas to compute through; use "
                             "-m esync"),
        Exclusion(On("overlap"), "--overlap already computes while the exchange runs; give "
                                 "--no-overlap"),
        Exclusion(On("local_iters"), "--local-iters fixes every worker's iterations, which "
                                     "carried ones would change; leave --local-iters at 0 (the "
                                     "state server decides)"),
    )),
    Choice("carry_slowest", "--carry-slowest", "schedule", bool, "--no-carry-slowest", (
        Exclusion(Off("carry"), "it extends --carry to the slowest device; add --carry"),
        Exclusion(On("policy"), "the planned policy's k_i fill the round after the exchange, so "
                                "the slowest has nothing to carry; give --policy dynamic"),
    )),
    Choice("accumulate", "--accumulate", "local rule", bool, "--no-accumulate", (
        Exclusion(NOT_ESYNC, "-m {mode} has no local iterations to accumulate; use -m esync"),
        Exclusion(On("overlap"), "--overlap goes on from the worker's own delta; give "
                                 "--no-overlap"),
        Exclusion(On("prox_mu"), "the model does not move within a round, so nothing pulls it "
                                 "back; give --prox-mu 0"),
        Exclusion(On("scaffold"), "SCAFFOLD corrects local steps, and there are none; give "
                                  "--no-scaffold"),
    )),
    Choice("prox_mu", "--prox-mu", "local rule", bool, "--prox-mu 0"),
    Choice("scaffold", "--scaffold", "local rule", bool, "--no-scaffold"),
    Choice("local_iters", "--local-iters", "round sizing", _any_fixed, "--local-iters 0"),
    Choice("policy", "--policy", "round sizing", lambda policy: policy == "planned",
           "--policy dynamic"),
)
_BY_OPTION = {c.option: c for c in CHOICES}
OPTIONS = frozenset(_BY_OPTION)          # the options that choose a part


def choice(option: str) -> Choice:
    """The declaration of the choice ``option`` (an argparse dest) turns on."""
    try:
        return _BY_OPTION[option]
    except KeyError:
        raise KeyError(f"{option!r} chooses no part of ESync; the options that do: "
                       f"{', '.join(_BY_OPTION)}") from None


def is_on(option: str, settings) -> bool:
    """Whether ``settings`` turn on the choice of ``option`` (unset: no)."""
    value = setting(settings, option)
    return value is not None and bool(choice(option).turns_on(value))


def conflict(option: str, settings) -> str | None:
    """What in ``settings`` excludes the choice of ``option``, as the fix to give; None:
    nothing does (values still unset exclude nothing, so a default can yield to a flag)."""
    for exclusion in choice(option).excludes:
        if exclusion.by.holds(settings):
            return exclusion.fix.format_map(_Values(settings))
    return None


def check(settings) -> None:
    """Refuse the first choice that is on and excluded by the rest, naming the flag and the
    fix (``UsageError``)."""
    for each in CHOICES:
        if is_on(each.option, settings):
            fix = conflict(each.option, settings)
            if fix is not None:
                raise UsageError(each.refusal(fix))


def chosen(part: str, settings) -> str | None:
    """The option whose choice runs ``part`` (the first one on, in ``CHOICES``' order); None:
    the part's default."""
    if part not in PARTS:
        raise KeyError(f"{part!r} is no part of ESync; the parts: {', '.join(PARTS)}")
    return next((c.option for c in CHOICES if c.part == part and is_on(c.option, settings)),
                None)


class _Values(dict):
    """The settings as ``str.format_map`` reads them."""

    def __init__(self, settings):
        super().__init__()
        self.settings = settings

    def __missing__(self, option):
        return setting(self.settings, option)


def sit_out_ratio(settings) -> float:
    """``--sit-out-ratio`` where a device can sit out, else 0 (``esync.coordination.rules.
    sitting_out_ranks``); ``settings`` as everywhere here (a run.json's dict too).

    A device that sits out pushes an empty delta with k = 0 every round: only the weighted
    aggregation gives it no weight, only deltas in full stay empty on the wire (rank-R factors
    of a zero delta would be normalised by a zero norm), SCAFFOLD and --accumulate divide by k,
    and --overlap sends a round's delta a round late."""
    supported = (setting(settings, "policy") in (None, "dynamic")
                 and not setting(settings, "local_iters")
                 and setting(settings, "aggregation") == "weighted"
                 and not setting(settings, "low_rank") and not setting(settings, "scaffold")
                 and not setting(settings, "accumulate") and not setting(settings, "overlap"))
    return float(setting(settings, "sit_out_ratio") or 0.0) if supported else 0.0


# Where devices may sit out, a worker's warm-up (its first c, judged before it computes) times a
# step on this fraction of a batch: a x150 device holds round 1 up for 1/8 of its iteration.
PROBE_DIVISOR = 8


# While some device sits out, a round lasts this many of the fastest device's iterations (or the
# slowest remaining device's one, if longer): the rounds of the default 1,1,4,8 cluster, for
# which the outer step's settings were tuned (docs/ALGORITHM.md, "Devices that sit out").
BOUNDED_ROUND_ITERATIONS = 8


def bounded_length(on_time) -> float:
    """A round's duration while some device sits out: the slowest remaining device's iteration,
    at least ``BOUNDED_ROUND_ITERATIONS`` of the fastest's (``on_time``: their durations)."""
    return max(max(on_time), BOUNDED_ROUND_ITERATIONS * min(on_time))
