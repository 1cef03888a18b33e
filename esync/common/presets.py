"""What a run uses, resolved once: defaults, then the presets its situation selects, then the
user's flags, with the source of every value recorded.

``config.py`` holds the defaults (the original ESync's, one commented line each); this module
holds the values that depend on the situation, as named presets in one table (``PRESETS``).
``resolve`` is a pure function: given the defaults, the situation (which tool, which backend,
which data split, the links, the devices, what the user gave) and a rule saying what a value
cannot be combined with, it returns a ``Resolution`` recording every value and where it came
from. ``esync-cluster --explain`` and ``main.py --explain`` print it; ``run.json`` keeps it.

A preset never overrides a flag the user gave, and a preset value yields (stays at what it was)
where it cannot be combined with what is already chosen: ``--overlap`` given by hand turns the
rank-32 deltas of shaped links off rather than failing. Each preset names its evidence in one
line: the page of the docs site that gives the measurements (docs/settings.md).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from esync.common.argtypes import HelpFormatter

# Learning rates keep the original's meaning (x the gradient summed over the batch): 0.05 / 64
# is a step of 0.05 on the mean gradient of a 64-sample batch, which suits lenet.
CLUSTER_LR = 0.05 / 64
ADAM_STEP = 0.01            # -gl as Adam's step size: a coordinate moves by about this a round
DEMO_SLOWDOWN = "1,1,4,8"   # the emulated demo cluster: two fast devices, one 4x, one 8x slower
EVIDENCE = "docs/settings.md"
SECRETS = frozenset({"state_token"})   # never in a record, a log or on a screen
# An exchange costing this share of the slowest device's iteration, or more, is costly
# (docs/settings.md#which-exchange-rule).
COSTLY_EXCHANGE = 2.0


@dataclass(frozen=True)
class Situation:
    """What selects the presets: known before anything starts (no host is contacted)."""
    tool: str = "esync-cluster"          # "esync-cluster" or "main.py"
    backend: str = "local"               # local, ssh, slurm, kubernetes
    shaped: bool = False                 # --net netns with a --bandwidth or --server-bandwidth
    split: int = 0                       # -s
    mode: str = "esync"                  # -m
    workers: int = 1
    gpus: bool = False                   # some worker is a GPU
    user: Mapping[str, Any] = field(default_factory=dict)   # the flags the user gave, by dest
    # One exchange's seconds over one iteration of the slowest device (esync.launch.
    # exchange_cost); None: not measured (other machines' links, or nothing reads it).
    exchange_ratio: float | None = None
    exchange_basis: str = ""             # how the ratio was found, in words

    @property
    def free_links(self) -> bool:
        """Every process on this machine and no rate set: an exchange costs little."""
        return self.backend == "local" and not self.shaped

    @property
    def costly_exchange(self) -> bool:
        """An exchange costs a large share of a round: by the measured ratio; where it was not
        measured, any link with a rate or between machines counts as costly."""
        if self.exchange_ratio is None:
            return not self.free_links
        return self.exchange_ratio >= COSTLY_EXCHANGE

    @property
    def demo(self) -> bool:
        """The emulated CPU cluster on this machine, where the demo's small network fits."""
        return self.tool == "esync-cluster" and self.backend == "local" and not self.gpus

    def gave(self, *dests: str) -> bool:
        return any(d in self.user for d in dests)


@dataclass(frozen=True)
class Preset:
    """Values a situation selects. ``when`` reads the situation and the values chosen so far
    (defaults, earlier presets, the user's flags); ``sets`` is applied in order."""
    name: str
    when: Callable[[Situation, Mapping[str, Any]], bool]
    sets: Mapping[str, Any]
    condition: str          # ``when`` in words, for --help, --explain and the docs
    evidence: str           # one line: where the measurements are
    reads_exchange: bool = False   # ``when`` reads Situation.exchange_ratio (measured first)


def _iid_esync(s: Situation, v) -> bool:
    return s.tool == "esync-cluster" and s.split == 0


PRESETS: tuple[Preset, ...] = (
    Preset("cluster", lambda s, v: s.tool == "esync-cluster",
           dict(cpu=1, mode="esync", eval_duration=10, max_round_seconds=5.0, inline_eval=False),
           "every esync-cluster run: checkpoints every 10 rounds (its evaluator scores them, "
           "the workers do not), stretched rounds up to 5 s",
           f"{EVIDENCE}#every-cluster"),
    Preset("demo", lambda s, v: s.demo,
           dict(network="lenet", learning_rate=CLUSTER_LR, max_seconds=90.0),
           "esync-cluster on this machine with CPU devices (the emulated demo cluster)",
           f"{EVIDENCE}#the-emulated-demo-cluster"),
    Preset("demo-slowdown", lambda s, v: s.demo and s.workers == 4,
           dict(slowdown_list=DEMO_SLOWDOWN),
           "the demo cluster with 4 workers: slowed 1,1,4,8",
           f"{EVIDENCE}#the-emulated-demo-cluster"),
    Preset("iid", _iid_esync,
           dict(aggregation="weighted", outer_momentum=0.9, nesterov=True, global_lr=0.7,
                local_lr=CLUSTER_LR),
           "esync-cluster on i.i.d. data (-s 0): deltas weighted by k_i, DiLoCo's outer "
           "Nesterov momentum",
           f"{EVIDENCE}#iid-data"),
    Preset("class-ordered", lambda s, v: s.tool == "esync-cluster" and s.split == 1,
           dict(aggregation="sum", accumulate=True, local_lr=9.5e-05),
           "esync-cluster on class-ordered shards (-s 1): every delta in full, gradients "
           "accumulated at the round's model",
           f"{EVIDENCE}#class-ordered-data-s-1"),
    Preset("class-shuffled", lambda s, v: s.tool == "esync-cluster" and s.split == 2,
           dict(aggregation="sum", outer_momentum=0.9, local_lr=3e-04),
           "esync-cluster on class-shuffled shards (-s 2): every delta in full",
           f"{EVIDENCE}#class-shuffled-data-s-2"),
    Preset("class-shuffled-adam",
           lambda s, v: (s.tool == "esync-cluster" and s.split == 2
                         and not s.gave("outer_momentum", "nesterov", "global_lr")),
           dict(outer_adam=True),
           "-s 2 unless an outer momentum, --nesterov or -gl is given: Adam as the outer step",
           f"{EVIDENCE}#class-shuffled-data-s-2"),
    Preset("adam-step", lambda s, v: bool(v.get("outer_adam")),
           dict(global_lr=ADAM_STEP, nesterov=False),
           "Adam as the outer step: -gl is its step size; it has no Nesterov form",
           f"{EVIDENCE}#class-shuffled-data-s-2"),
    Preset("costly-exchange", lambda s, v: (s.tool == "esync-cluster" and s.split == 0
                                            and s.mode == "esync" and s.costly_exchange),
           dict(low_rank=32),
           f"ESync on i.i.d. data where an exchange costs {COSTLY_EXCHANGE:g} of the slowest "
           "device's iteration or more (measured before start; unmeasured: links with a rate or "
           "between machines): deltas as rank-32 factors",
           f"{EVIDENCE}#which-exchange-rule", reads_exchange=True),
    Preset("costly-exchange-factors",
           lambda s, v: (s.tool == "esync-cluster" and s.split == 0 and s.mode == "esync"
                         and s.costly_exchange and bool(v.get("low_rank"))),
           dict(comm_share=0.2, overlap=False),
           "that exchange with low-rank deltas: rounds stretched to an exchange share of 0.2",
           f"{EVIDENCE}#which-exchange-rule", reads_exchange=True),
    Preset("costly-exchange-full",
           lambda s, v: (s.tool == "esync-cluster" and s.split == 0 and s.mode == "esync"
                         and s.costly_exchange and not v.get("low_rank")),
           dict(comm_share=0.1, overlap=True),
           "that exchange with deltas in full: rounds stretched to an exchange share of 0.1, "
           "the exchange overlapped with the next round",
           f"{EVIDENCE}#which-exchange-rule", reads_exchange=True),
    Preset("shaped-full", lambda s, v: (s.tool == "esync-cluster" and s.shaped
                                        and s.costly_exchange and s.mode == "esync"
                                        and not v.get("low_rank")),
           dict(comm_dtype="float16"),
           "a costly exchange over shaped links with deltas in full: float16 on the wire",
           f"{EVIDENCE}#which-exchange-rule", reads_exchange=True),
    Preset("cheap-exchange", lambda s, v: (s.tool == "esync-cluster" and s.split == 0
                                           and s.mode == "esync" and not s.costly_exchange),
           dict(comm_share=1.0, overlap=False),
           f"ESync on i.i.d. data where an exchange costs less than {COSTLY_EXCHANGE:g} of the "
           "slowest device's iteration (free links: every process here, no rate): rounds of one "
           "slowest iteration, nothing overlapped",
           f"{EVIDENCE}#which-exchange-rule", reads_exchange=True),
    Preset("sit-out", lambda s, v: s.tool == "esync-cluster" and s.mode == "esync",
           dict(sit_out_ratio=32.0),
           "every ESync cluster run: a device over 32 times slower than the fastest sits out "
           "(where the exchange allows it: weighted deltas in full, not overlapped)",
           f"{EVIDENCE}#devices-that-sit-out"),
    Preset("iid-carry", _iid_esync, dict(carry=True),
           "i.i.d. data wherever the exchange is not overlapped: the fast devices compute "
           "through it (carry)",
           f"{EVIDENCE}#iid-data"),
)


@dataclass(frozen=True)
class Resolution:
    """Every resolved value with its source ("default", "preset NAME", "user flag")."""
    values: Mapping[str, Any]
    sources: Mapping[str, str]
    presets: tuple[str, ...]
    yielded: Mapping[str, str]              # option -> why a preset's value did not apply
    situation: Situation

    def record(self) -> dict:
        """The JSON form run.json keeps."""
        situation = {k: v for k, v in vars(self.situation).items() if k != "user"}
        return {"situation": situation, "presets": list(self.presets),
                "values": {k: _jsonable(v) for k, v in self.values.items()
                           if k not in SECRETS},
                "sources": {k: v for k, v in self.sources.items() if k not in SECRETS},
                "yielded": dict(self.yielded)}


def resolve(defaults: Mapping[str, Any], situation: Situation, *,
            excluded: Callable[[str, Mapping[str, Any]], str | None] = lambda o, v: None,
            derived: Mapping[str, tuple[Any, str]] = MappingProxyType({}),
            presets: tuple[Preset, ...] = PRESETS) -> Resolution:
    """Defaults, then every preset the situation selects (in table order), then the user's
    flags. ``excluded(option, values)`` says what in ``values`` a preset's value for
    ``option`` cannot be combined with (None: nothing); such a value yields. ``derived``:
    defaults another flag decided, as (value, source): the workers a --hostfile places."""
    values, sources, yielded, applied = dict(defaults), dict.fromkeys(defaults, "default"), {}, []
    for option, (value, source) in derived.items():
        values[option], sources[option] = value, source
    user = dict(situation.user)
    for preset in presets:
        current = {**values, **user}
        if not preset.when(situation, current):
            continue
        applied.append(preset.name)
        for option, value in preset.sets.items():
            if option in user:
                continue
            why = excluded(option, {**current, option: value})
            if why:
                yielded[option] = f"preset {preset.name} yielded: {why}"
                continue
            values[option] = current[option] = value
            sources[option] = f"preset {preset.name}"
    values.update(user)
    sources.update(dict.fromkeys(user, "user flag"))
    return Resolution(MappingProxyType(values), MappingProxyType(sources), tuple(applied),
                      MappingProxyType(yielded), situation)


def help_note(dest: str, presets: tuple[Preset, ...] = PRESETS) -> str:
    """What the presets set ``dest`` to, for its --help line ('' when none does)."""
    notes = [f"{_shown(p.sets[dest])} by preset {p.name}" for p in presets if dest in p.sets]
    return f" [esync-cluster: {'; '.join(notes)}; see --explain]" if notes else ""


class PresetHelpFormatter(HelpFormatter):
    """--help shows, beside each default, what the presets set the option to."""

    def _get_help_string(self, action):
        return super()._get_help_string(action) + help_note(action.dest)


def given_options(parser: argparse.ArgumentParser, argv) -> dict[str, Any]:
    """The options ``argv`` gives, by dest, with their parsed values (defaults left out)."""
    unset = object()
    dests = {a.dest for a in parser._actions if a.dest != argparse.SUPPRESS}
    namespace = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(dests, unset)))
    return {k: v for k, v in vars(namespace).items() if v is not unset}


def explain(resolution: Resolution, parser: argparse.ArgumentParser, *, values=None,
            extra=()) -> str:
    """The resolved run as text: one line per option, grouped as the parser groups them, with
    its flag, value and source; then the presets that applied and what they yielded.
    ``values``: the final values when checks completed some (absolute paths, per-worker
    lists); by default the resolution's."""
    s = resolution.situation
    links = "free" if s.free_links else "shaped" if s.shaped else "other machines'"
    lines = [f"{parser.prog}: the resolved run (nothing was started)"]
    if s.tool == "esync-cluster":
        lines.append(f"situation: backend {s.backend}, {links} links, -s {s.split}, "
                     f"-m {s.mode}, {s.workers} worker(s){', GPU devices' if s.gpus else ''}")
        if s.exchange_basis:
            ratio = "unknown" if s.exchange_ratio is None else f"{s.exchange_ratio:.2f}"
            lines.append(f"exchange / slowest iteration: {ratio} "
                         f"({'costly' if s.costly_exchange else 'cheap'}; "
                         f"costly from {COSTLY_EXCHANGE:g}): {s.exchange_basis}")
    values = resolution.values if values is None else values
    sources = resolution.sources
    for group in parser._action_groups:
        rows = [(_flag(a), a.dest) for a in group._group_actions
                if a.option_strings and a.dest in values
                and a.dest not in {"help", "explain", *SECRETS}]
        if not rows:
            continue
        lines.append(f"\n{group.title}:")
        width = max(len(flag) for flag, _ in rows)
        shown = max(len(_shown(values[dest])) for _, dest in rows)
        for flag, dest in rows:
            lines.append(f"  {flag:<{width}}  {_shown(values[dest]):<{shown}}  "
                         f"{sources.get(dest, 'default')}")
    for title, text in extra:
        lines.append(f"\n{title}: {text}")
    lines.append("\npresets applied: " + (", ".join(resolution.presets) or "none"))
    for option, why in resolution.yielded.items():
        lines.append(f"  {option}: {why}")
    for preset in (p for p in PRESETS if p.name in resolution.presets):
        lines.append(f"  {preset.name}: {preset.condition} ({preset.evidence})")
    return "\n".join(lines)


def _flag(action) -> str:
    """The option's long name (``--nesterov``, not its ``--no-`` form)."""
    names = action.option_strings
    if isinstance(action, argparse.BooleanOptionalAction):
        return names[0]
    return names[-1]


def _shown(value) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "on", False: "off", None: "-"}[value]
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "-"
    return str(value)


def _jsonable(value):
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)
