"""esync-advise: should a slow device take part? Predictions from one run's own logs.

    esync-advise logs/lenet/esync                       # every slow device in or out
    esync-advise logs/lenet/esync --target 0.80         # another target accuracy
    esync-advise logs/lenet/esync --without vm/cpu3     # one subset of the run's devices
    esync-cluster -m esync --workers 4 --slowdown 1,1,50,150 --max-seconds 60 -ld probe
    esync-advise probe                                  # a short probe run, then its advice

It reads the run's per-device round logs (``<host>/<device>/iter-<n>.txt``), its evaluations
(``evaluations.jsonl``: accuracy against the global samples so far) and ``run.json`` (the mode
and ``--carry``), all through ``esync.analysis.summary``, and predicts the time to ``--target``
for the whole cluster, for the cluster without each slow device, and for the fast devices alone.

The model (small on purpose; every number is measured in the run itself):

* **Speed.** Device i computes one iteration in ``t_i`` seconds (its computing seconds over the
  iterations it computed, those carried through an exchange included; emulated slow-down
  included) and processes ``b_i`` samples per iteration, so ``r_i = b_i / t_i`` samples per
  second. A device's speed does not depend on who else runs.
* **Exchange.** One exchange costs ``c`` seconds, the same whoever takes part: the smallest of
  the devices' median aggregation phases (``"global update"`` / ``"global aggregate"``). The
  device that arrives last waits least, so its phase is the transfer alone.
* **Rounds, by mode.** ESync: a round computes for one iteration of its slowest device,
  ``L = max t_i``, during which device i processes ``r_i L`` samples; with ``--carry`` every
  device but the slowest also computes through the exchange (``r_i c`` more). Where the run let
  devices sit out (``--sit-out-ratio R``, as run.json says), a device the state server found
  over R times the fastest computes nothing (who sat out is read from the logs: the server
  judged by probes they do not all keep): judged by its warm-up probe (a step on 1/8 of a batch,
  ``esync_parts.PROBE_DIVISOR``), it holds the first round up for that probe, an eighth of its
  iteration; later rounds last ``max(max t_i, 8 min t_i)`` over the devices left
  (``esync_parts.bounded_length``). Such a device has no computed iteration: its speed is its
  warm-up step's, logged as ``iteration_time``. SSGD: a round is one iteration of every device,
  ``max t_i``, and ``sum b_i`` samples. ASGD and DC-ASGD: no rounds; device i adds the samples
  per second it added in the run.
* **What the rounds cost beyond that, from the run** (``Calibration``). A round of the run
  lasted ``R`` seconds on average (its round logs' clock), more than the model's length: the
  exchange, the state server's questions, the outer step and the waits add ``o = R - L`` to
  every round, whoever takes part. Its rounds held ``f`` times the model's samples (carried
  iterations, a device that stopped short of a round's end). Every subset's rounds last its
  ``L + o`` and hold ``f`` times its model's samples.
* **The first round.** Nobody stops before every device has finished its first iteration, so
  the first round lasts until the slowest device's warm-up step and first iteration (its
  one-off set-up included) are done, and the others compute all through it. The run's first
  round ended ``s`` seconds later than the model's (one round; with devices that sit out, the
  slowest's probe), a lateness that comes with its slowest device: a subset's first round is
  its model's plus ``s`` times its slowest iteration over the run's, and holds its devices'
  samples per second over that time, times the share ``f1`` of that the run's first round
  held. For the run's own devices the prediction is then the run's own pace.
* **Accuracy.** The test accuracy depends on the samples processed alone, whoever processed them
  and however they were grouped into rounds (i.i.d. shards; no staleness penalty): the run's own
  evaluations give ``S*``, the samples at which it first reached the target (interpolated
  between the checkpoints around the crossing). A round mode crosses the target when its
  samples pass ``S*`` (the first round's, then ``samples per round`` a round), the crossing
  interpolated within its round as the benchmark interpolates the measured one between
  checkpoints (a new model exists only at a round's end: the time is known to within a round);
  an asynchronous one after ``S* / rate`` seconds.

What it leaves out: a server link shared by more devices, and how the samples a model needs
depend on their grouping into rounds: where a slow device makes rounds very long, the measured
time is later than predicted; where a subset's rounds hold far fewer iterations than the run's
(``STEPS_CHANGE``; the fast devices alone, one iteration a round, against the run's eight), it
may need more samples than the run did, and the advice says so in a caveat. Predictions
within ``SAME_SHARE`` of each other are one choice (the advice then keeps the device: it adds
samples at no measurable cost).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from esync.analysis import summary as summary_mod
from esync.common import esync_parts, runlayout
from esync.common.esync_parts import bounded_length
from esync.common.argtypes import HelpFormatter

PROG = "esync-advise"
ROUND_MODES = ("esync", "sync")
ASYNC_MODES = ("async", "dcasgd")
SLOW_RATIO = 1.5      # slow: an iteration this many times longer than the fastest device's
# Predictions this close are one choice: the spread of one row's repeats in the sweep is wider
# (docs/results/wide-gaps.md, "The advisor against the sweep").
SAME_SHARE = 0.05
# A subset whose rounds hold this many times fewer (or more) iterations than the run's is
# trained by steps the run did not measure: its prediction comes with a caveat.
STEPS_CHANGE = 2.0
FAST_ALONE = "the fast devices alone"       # the subset without every slow device
NO_LOGS = ("{folder}: no run here: give the mode folder of an earlier run "
           f"(<log dir>/<network>/<mode>, holding <host>/<device>/{runlayout.ROUND_LOG_PATTERN} "
           f"and {runlayout.RUN_FILE}), or the -ld folder of a run")
UNKNOWN_DEVICE = "{device!r} is not a device of this run; its devices are {known}"


class AdviceError(Exception):
    """Input the advisor cannot use; the message says what to give instead."""


@dataclass(frozen=True)
class Device:
    """One device as the run measured it."""
    name: str                 # host/device
    iteration_s: float        # computing seconds per iteration
    samples_per_iteration: float
    exchange_s: float         # median aggregation phase per round
    round_s: float = 0.0      # its rounds' mean length on the training clock
    first_end_s: float = 0.0  # the training clock at the end of its first round
    samples: float = 0.0      # samples it computed in the run
    elapsed_s: float = 0.0    # the training clock at the end of its last round
    first_samples: float = 0.0  # samples it computed in its first round
    rounds: int = 0           # rounds it logged
    waits: tuple = ()         # per round, the seconds it did not compute (None: not logged)
    sat_out: bool = False     # it computed nothing in the second half of its rounds

    @property
    def wait_s(self) -> float:
        """Its median seconds per round not computing (from its second round on)."""
        known = [w for w in self.waits[1:] if w is not None]
        return statistics.median(known) if known else self.exchange_s

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_iteration / self.iteration_s

    @property
    def added_per_s(self) -> float:
        """Samples per second of training it added (what an asynchronous mode sums)."""
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class Calibration:
    """What the run's rounds cost beyond the model's compute (see the docstring): ``cost_s``
    (o) every round pays, ``stretch_s`` (J) the run's rounds lasted longer still, which comes
    with its slowest devices (``slowest_s``: the model's round length for them), ``fill`` (f)
    the run's samples per round over the model's, ``start_s`` (s) the first round's lateness,
    which comes with the run's slowest device (``start_iteration_s``: its iteration),
    ``first_fill`` (f1) the run's first round's samples over its devices' samples per second
    times its length. The default: nothing added."""
    cost_s: float = 0.0
    stretch_s: float = 0.0
    slowest_s: float = math.inf
    fill: float = 1.0
    start_s: float = 0.0
    start_iteration_s: float = math.inf
    first_fill: float = 1.0


@dataclass(frozen=True)
class Prediction:
    devices: tuple[str, ...]
    samples_per_s: float      # while computing, over the subset
    round_s: float | None     # None for the asynchronous modes
    samples_per_round: float | None
    rounds: int | None        # the round in which it crosses the target, the first included
    time_s: float
    local_steps: float | None = None   # its fastest device's iterations a round (None: no rounds)


@dataclass(frozen=True)
class Run:
    folder: Path
    mode: str
    carry: bool
    devices: tuple[Device, ...]
    exchange_s: float
    samples_to_target: float
    target: float
    sit_out: float = 0.0      # --sit-out-ratio where it engaged (0: every device waited for)
    calibration: Calibration = Calibration()


# ----------------------------------------------------------------------------- reading a run

def find_mode_dir(folder: Path) -> Path:
    """``folder`` itself when it is a mode folder, else the one mode folder under it
    (``<network>/<mode>``); none or several: ``AdviceError``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise AdviceError(NO_LOGS.format(folder=folder))
    if summary_mod.find_device_dirs(folder):
        return folder
    found = sorted(p.parent for p in folder.glob(f"*/*/{runlayout.RUN_FILE}")
                   if summary_mod.find_device_dirs(p.parent))
    if len(found) == 1:
        return found[0]
    if found:
        raise AdviceError(f"{folder} holds several runs ({', '.join(map(str, found))}): give "
                          "one of them")
    raise AdviceError(NO_LOGS.format(folder=folder))


def device_of(name: str, entry: dict, batch_size: int) -> Device:
    # the iterations it computed: each round's own and those it carried through the exchange
    iterations = sum(entry.get("k_list") or entry["self_iters_list"])
    iterations += sum(n or 0 for n in entry.get("carried_iterations_list") or [])
    compute = sum(entry["compute_time_list"])
    elapsed = entry["elapsed_time_list"]
    per_round = entry["num_samples_list"]
    clock = dict(sat_out=len(per_round) > 1 and not any(per_round[len(per_round) // 2:]),
                 exchange_s=statistics.median(entry["aggregate_time_list"]),
                 round_s=(elapsed[-1] - elapsed[0]) / (len(elapsed) - 1) if len(elapsed) > 1
                 else elapsed[0], first_end_s=elapsed[0],
                 samples=sum(per_round), elapsed_s=elapsed[-1], first_samples=per_round[0],
                 rounds=len(elapsed), waits=tuple(entry.get("wait_time_list") or ()))
    if iterations <= 0 or compute <= 0:
        # A device that sat out from the start (--sit-out-ratio) computed nothing; its speed is
        # its warm-up step's, which the round logs keep as its latest iteration time.
        timed = [t for t in entry.get("iteration_time_list") or [] if t]
        if not timed:
            raise AdviceError(f"device {name}: its logs hold no computed iteration")
        return Device(name=name, iteration_s=timed[-1], samples_per_iteration=batch_size,
                      **clock)
    return Device(name=name, iteration_s=compute / iterations,
                  samples_per_iteration=sum(entry["num_samples_list"]) / iterations, **clock)


def samples_to(evaluations: dict | None, target: float) -> float:
    """Global samples at which the evaluations first reached ``target``, interpolated between
    the checkpoints around the crossing (from no samples and no accuracy before the first)."""
    if not evaluations or not evaluations.get("accuracy_list"):
        raise AdviceError(f"the run has no evaluations ({runlayout.EVALUATIONS}): the advisor "
                          "needs its accuracy against samples; run it with the evaluator (the "
                          "launcher's default)")
    points = [(s, a) for s, a in zip(evaluations["samples_list"], evaluations["accuracy_list"])
              if s is not None]
    if not points:
        raise AdviceError("the run's evaluations carry no sample counts: rerun it with this "
                          "checkout")
    before = (0.0, 0.0)
    for samples, accuracy in points:
        if accuracy >= target:
            (s0, a0) = before
            return s0 + (samples - s0) * (target - a0) / (accuracy - a0)
        before = (samples, accuracy)
    best = max(a for _, a in points)
    raise AdviceError(f"the run never reached {target:g} (best {best:.3f}): give a lower "
                      "--target or a longer run")


def read(folder, target: float) -> Run:
    """The run in ``folder`` as the model needs it."""
    mode_dir = find_mode_dir(Path(folder))
    try:
        summary = summary_mod.summarize(mode_dir)
    except summary_mod.LogError as exc:
        raise AdviceError(str(exc)) from None
    run = summary.get("_run") or {}
    mode = run.get("mode") or summary_mod.split_mode(mode_dir.name)[0]
    if run.get("use_dcasgd"):
        mode = "dcasgd"
    if mode not in ROUND_MODES + ASYNC_MODES:
        raise AdviceError(f"{mode_dir}: a {mode!r} run has one device; the advisor reads a "
                          "cluster run (esync, sync, async, dcasgd)")
    batch = int(run.get("batch_size") or 0)
    devices = tuple(device_of(f"{host}/{device}", entry, batch)
                    for host, device, entry in summary_mod.device_entries(summary))
    sit_out = esync_parts.sit_out_ratio(run) if mode == "esync" else 0.0
    found = Run(folder=mode_dir, mode=mode, carry=bool(run.get("carry")), devices=devices,
                sit_out=sit_out, exchange_s=min(d.exchange_s for d in devices),
                samples_to_target=samples_to(summary.get("_evaluator"), target), target=target)
    return dataclasses.replace(found, calibration=calibrate(found))


def calibrate(run: Run) -> Calibration:
    """The run's rounds against the model's for its own devices (``Calibration``): every
    round pays what the device that arrived last did not compute (its exchange, the state
    server's questions, the outer step: the median over rounds of the least wait); the rest
    of the run's mean round beyond its model length is the stretch; the fill and the start
    make the run's own samples per round and first round."""
    if run.mode in ASYNC_MODES:
        return Calibration()
    rounds = min(d.rounds for d in run.devices)
    least = [min(w) for w in zip(*(d.waits[1:rounds] for d in run.devices))
             if all(x is not None for x in w)]
    cost = statistics.median(least) if least else run.exchange_s
    measured_round = statistics.median(d.round_s for d in run.devices)
    slowest = model_length(run, run.devices)
    cal = Calibration(cost_s=cost, stretch_s=max(0.0, measured_round - slowest - cost),
                      slowest_s=slowest)
    model = round_plan(run, run.devices, cal)
    measured_samples = sum(d.samples for d in run.devices) / statistics.median(
        d.rounds for d in run.devices)
    if model.samples_per_round <= 0 or measured_samples <= 0:
        return cal
    first_end = max(d.first_end_s for d in run.devices)
    first_modelled = (model.first_samples_per_s or 0.0) * first_end
    return dataclasses.replace(
        cal, fill=measured_samples / model.samples_per_round,
        start_s=max(0.0, first_end - model.first_s),
        start_iteration_s=max(d.iteration_s for d in run.devices),
        first_fill=(sum(d.first_samples for d in run.devices) / first_modelled
                    if first_modelled > 0 else 1.0))


# ----------------------------------------------------------------------------- the model

@dataclass(frozen=True)
class RoundPlan:
    """A round mode's rounds for some devices: their length and samples, and the first
    round's length before the start-up lateness (a round; ESync with devices that sit out, the
    slowest's probe) and what it holds: SSGD a round's samples, ESync ``first_samples_per_s``
    for as long as it lasts (``first_round``)."""
    round_s: float
    samples_per_round: float
    samples_per_s: float          # while computing, over the devices that compute
    first_s: float
    first_samples_per_s: float | None = None   # None: the first round holds a round's samples
    local_steps: float = 1.0      # the fastest device's iterations a round


def model_length(run: Run, devices) -> float:
    """The compute of one round: SSGD's slowest iteration; ESync's (bounded while some device
    sits out)."""
    if run.mode == "sync":
        return max(d.iteration_s for d in devices)
    computing = computing_devices(devices, run.sit_out)
    return esync_round_length(computing, bounded=len(computing) < len(devices))


def round_length(length: float, cal: Calibration) -> float:
    """A round of ``length`` s of compute: plus the cost every round pays, plus the run's
    stretch while the round is as long as the run's (it keeps one of the slowest devices)."""
    keeps_slowest = length * SLOW_RATIO >= cal.slowest_s
    return length + cal.cost_s + (cal.stretch_s if keeps_slowest else 0.0)


def round_plan(run: Run, devices, cal: Calibration) -> RoundPlan:
    """The rounds of ``run.mode`` on ``devices`` (see the docstring), with ``cal`` applied."""
    length = model_length(run, devices)
    round_s = round_length(length, cal)
    if run.mode == "sync":
        return RoundPlan(round_s, cal.fill * sum(d.samples_per_iteration for d in devices),
                         sum(d.samples_per_s for d in devices), first_s=round_s)
    computing = computing_devices(devices, run.sit_out)
    fastest = min(computing, key=lambda d: d.iteration_s)
    rate = sum(d.samples_per_s for d in computing)
    # Nobody stops before every device has been timed (the slowest's first iteration; with
    # devices that sit out, its probe): every device that computes does so all through the
    # first round; those its probe judged too slow compute nothing.
    first_s = (round_s if len(computing) == len(devices) else
               max(d.iteration_s for d in devices) / esync_parts.PROBE_DIVISOR + cal.cost_s)
    return RoundPlan(round_s, cal.fill * esync_round_samples(computing, length, round_s,
                                                             run.carry),
                     rate, first_s=first_s, first_samples_per_s=rate,
                     local_steps=busy_s(fastest, length, round_s, run.carry)
                     / fastest.iteration_s)


def first_round(plan: RoundPlan, devices, cal: Calibration) -> tuple[float, float]:
    """(its end, its samples): the model's first round, later by the run's start-up lateness
    scaled by the slowest iteration of ``devices`` over the run's, holding a round's samples
    (SSGD) or its devices' samples per second all that time, times the run's ``first_fill``
    (ESync)."""
    slowest = max(d.iteration_s for d in devices)
    end = plan.first_s + cal.start_s * min(1.0, slowest / cal.start_iteration_s)
    if plan.first_samples_per_s is None:
        return end, plan.samples_per_round
    return end, cal.first_fill * plan.first_samples_per_s * end


def predict(run: Run, names) -> Prediction:
    """The predicted time to the target with only the devices ``names`` (see the docstring)."""
    devices = [d for d in run.devices if d.name in set(names)]
    names = tuple(d.name for d in devices)
    if run.mode in ASYNC_MODES:
        added = sum(d.added_per_s or d.samples_per_iteration / (d.iteration_s + run.exchange_s)
                    for d in devices)
        return Prediction(names, sum(d.samples_per_s for d in devices), None, None, None,
                          run.samples_to_target / added)
    cal = run.calibration
    plan = round_plan(run, devices, cal)
    first_end, first_samples = first_round(plan, devices, cal)
    later = max(0.0, run.samples_to_target - first_samples) / plan.samples_per_round
    return Prediction(names, plan.samples_per_s, plan.round_s, plan.samples_per_round,
                      1 + math.ceil(later - 1e-9), first_end + later * plan.round_s,
                      plan.local_steps)


def computing_devices(devices, sit_out: float) -> list[Device]:
    """The devices that compute after the first round: where the run let devices sit out
    (``sit_out``, its ratio), all but those that sat out in the run. The state server judged
    them by timings the logs do not all keep (the probes of devices that went on to compute);
    a subset keeps the fastest device they were judged against, so the judgment stands. The
    last device never sits out (``esync.coordination.rules``): the fastest then computes."""
    if sit_out <= 0:
        return list(devices)
    return ([d for d in devices if not d.sat_out]
            or [min(devices, key=lambda d: d.iteration_s)])


def esync_round_length(devices, *, bounded: bool) -> float:
    """One slowest iteration; while some device sits out, at least ``BOUNDED_ROUND_ITERATIONS``
    of the fastest's (``esync_parts.bounded_length``)."""
    times = [d.iteration_s for d in devices]
    return bounded_length(times) if bounded else max(times)


def esync_round_samples(devices, length: float, round_s: float, carry: bool) -> float:
    """Samples of one ESync round of ``length`` s of compute lasting ``round_s`` s: the devices
    whose iteration is about the round's (within ``SLOW_RATIO``) compute through ``length``;
    with ``--carry`` the faster ones compute through the whole round but what they did not
    compute in the run's rounds (``Device.wait_s``), else they too stop at ``length``."""
    return sum(d.samples_per_s * busy_s(d, length, round_s, carry) for d in devices)


def busy_s(device: Device, length: float, round_s: float, carry: bool) -> float:
    """The seconds ``device`` computes in an ESync round (``esync_round_samples``)."""
    slowest = device.iteration_s * SLOW_RATIO >= length
    return length if slowest or not carry else max(length, round_s - device.wait_s)


def slow_devices(run: Run) -> list[Device]:
    fastest = min(d.iteration_s for d in run.devices)
    return [d for d in run.devices if d.iteration_s > SLOW_RATIO * fastest]


def resolve_names(run: Run, given: list[str]) -> list[str]:
    """``host/device`` names of ``given`` (``device`` alone when it is unique)."""
    names = [d.name for d in run.devices]
    found = []
    for name in given:
        matches = [n for n in names if n == name or n.split("/", 1)[1] == name]
        if len(matches) != 1:
            raise AdviceError(UNKNOWN_DEVICE.format(device=name, known=", ".join(names)))
        found.append(matches[0])
    return found


def subsets(run: Run) -> list[tuple[str, list[str]]]:
    """(label, devices): the whole cluster, without each slow device, the fast ones alone."""
    everyone = [d.name for d in run.devices]
    slow = [d.name for d in slow_devices(run)]
    found = [("every device", everyone)]
    found += [(f"without {n}", [m for m in everyone if m != n]) for n in slow]
    if len(slow) > 1:
        found.append((FAST_ALONE, [m for m in everyone if m not in slow]))
    return found


def keeps(with_s: float, without_s: float) -> bool:
    """Include a device unless the time without it is shorter by more than ``SAME_SHARE``."""
    return with_s <= without_s * (1 + SAME_SHARE)


def advise(run: Run) -> dict:
    """Every subset's prediction, the fastest, and per slow device: include it or not, why."""
    predictions = [(label, predict(run, names)) for label, names in subsets(run)]
    whole = predictions[0][1]
    verdicts = []
    for label, p in predictions[1:]:
        if not label.startswith("without "):
            continue
        name = label.removeprefix("without ")
        device = next(d for d in run.devices if d.name == name)
        share = device.samples_per_s / whole.samples_per_s
        include = keeps(whole.time_s, p.time_s)
        if whole.time_s <= p.time_s:
            why = (f"include {name}: without it {p.time_s:.1f} s, with it {whole.time_s:.1f} s; "
                   f"it adds {share:.1%} of the samples")
        elif include:
            why = (f"include {name}: without it {p.time_s:.1f} s, with it {whole.time_s:.1f} s, "
                   f"within {SAME_SHARE:.0%}: the same to this model; it adds {share:.1%} of "
                   "the samples")
        else:
            why = (f"leave out {name}: it adds {share:.1%} of the samples but "
                   + (f"its {device.iteration_s:.2f} s iteration sets the rounds' length "
                      f"({whole.round_s:.2f} s against {p.round_s:.2f} s)"
                      if whole.round_s and p.round_s else "its updates cost more than they add")
                   + f": {p.time_s:.1f} s without it against {whole.time_s:.1f} s")
        verdicts.append({"device": name, "include": include, "why": why})
    best = min(predictions, key=lambda pair: pair[1].time_s)
    return {"predictions": predictions, "best": best, "verdicts": verdicts,
            "caveats": caveats(whole, predictions[1:])}


def caveats(whole: Prediction, others) -> list[str]:
    """Subsets whose rounds hold a number of iterations the run's did not (``STEPS_CHANGE``):
    the samples to the target were measured on the run's rounds, and how many a model needs
    depends on how its samples are grouped into rounds, which this model leaves out."""
    if not whole.local_steps:
        return []
    found = []
    for label, p in others:
        if p.local_steps and max(p.local_steps / whole.local_steps,
                                 whole.local_steps / p.local_steps) >= STEPS_CHANGE:
            found.append(f"{label}: its fastest device's iterations a round: about "
                         f"{p.local_steps:.3g}, against the run's {whole.local_steps:.3g}; the "
                         "samples to the target were measured on the run's rounds, so this "
                         "prediction is the least certain (docs/guide/advisor.md)")
    return found


# ----------------------------------------------------------------------------- command line

def render(run: Run, advice: dict) -> list[str]:
    cal = run.calibration
    L = [f"{PROG}: {run.folder} ({run.mode}{', carry' if run.carry else ''}): "
         f"{len(run.devices)} devices; {run.samples_to_target:.0f} samples reached "
         f"{run.target:g}; one exchange {run.exchange_s:.3f} s",
         f"from the run's rounds: {cal.cost_s:.3f} s a round beyond compute, "
         f"{cal.stretch_s:.3f} s more with its slowest devices, {cal.fill:.2f} of the modelled "
         f"samples a round, {cal.start_s:.2f} s of start-up", "",
         "| device | iteration (s) | samples/s |", "| --- | ---: | ---: |"]
    L += [f"| {d.name} | {d.iteration_s:.4g} | {d.samples_per_s:.1f} |" for d in run.devices]
    L += ["", "| devices | samples/s | round (s) | rounds | predicted time to "
              f"{run.target:g} (s) |",
          "| --- | ---: | ---: | ---: | ---: |"]
    for label, p in advice["predictions"]:
        round_s = "-" if p.round_s is None else f"{p.round_s:.3g}"
        rounds = "-" if p.rounds is None else str(p.rounds)
        L.append(f"| {label} | {p.samples_per_s:.1f} | {round_s} | {rounds} | {p.time_s:.1f} |")
    L += [""] + [v["why"] for v in advice["verdicts"]]
    L += [f"caveat: {c}" for c in advice["caveats"]]
    L.append(f"fastest: {advice['best'][0]} ({advice['best'][1].time_s:.1f} s)")
    return L


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, formatter_class=HelpFormatter,
                                     description="Predict the time to a target accuracy with "
                                                 "and without each slow device of an earlier "
                                                 "run, from its logs, and say which to include.")
    parser.add_argument("folder", help="the run's mode folder (<log dir>/<network>/<mode>) or "
                                       "its -ld folder")
    parser.add_argument("--target", type=float, default=0.85,
                        help="test accuracy to reach (the run itself must have reached it)")
    parser.add_argument("--without", action="append", default=[], metavar="DEVICE",
                        help="predict for the run's devices without DEVICE (host/device, or "
                             "device when unique; repeatable) instead of every subset")
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if not 0 < args.target <= 1:
            raise AdviceError(f"--target {args.target:g}: give an accuracy in (0, 1]")
        run = read(args.folder, args.target)
        if args.without:
            left_out = resolve_names(run, args.without)
            kept = [d.name for d in run.devices if d.name not in left_out]
            if not kept:
                raise AdviceError("--without leaves no device: keep at least one")
            p = predict(run, kept)
            everyone = predict(run, [d.name for d in run.devices])
            lines = [f"{PROG}: without {', '.join(left_out)}: {p.time_s:.1f} s to "
                     f"{args.target:g} (every device: {everyone.time_s:.1f} s)"]
            data = {"devices": list(p.devices), "time_s": p.time_s}
        else:
            advice = advise(run)
            lines = render(run, advice)
            data = {"predictions": [{"label": label, **vars(p)}
                                    for label, p in advice["predictions"]],
                    "verdicts": advice["verdicts"], "best": advice["best"][0],
                    "caveats": advice["caveats"]}
    except AdviceError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(data, indent=1) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
