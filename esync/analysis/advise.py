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

* **Speed.** Device i computes one iteration in ``t_i`` seconds (its computing seconds over its
  iterations, emulated slow-down included) and processes ``b_i`` samples per iteration, so
  ``r_i = b_i / t_i`` samples per second. A device's speed does not depend on who else runs.
* **Exchange.** One exchange costs ``c`` seconds, the same whoever takes part: the smallest of
  the devices' median aggregation phases (``"global update"`` / ``"global aggregate"``). The
  device that arrives last waits least, so its phase is the transfer alone; the others' hold
  their wait for it. Under CPU caps a very slow device's long CFS periods may lengthen ``c``
  itself, which the model then carries into subsets without that device (a pessimistic
  estimate for them).
* **Rounds, by mode.** ESync: a round computes for one iteration of its slowest device,
  ``L = max t_i``, during which device i processes ``r_i L`` samples; with ``--carry`` every
  device but the slowest also computes through the exchange (``r_i c`` more). A round lasts
  ``L + c``. Where the run let devices sit out (``--sit-out-ratio R``, as run.json says), a
  device over R times the fastest's iteration computes nothing: judged by its warm-up probe
  (a step on 1/8 of a batch, ``esync_parts.PROBE_DIVISOR``), it holds the first round up for
  that probe, an eighth of its iteration; later rounds last ``max(max t_i, 8 min t_i)`` over
  the devices left (``esync_parts.bounded_length``). Such a device has no computed iteration:
  its speed is its warm-up step's, logged as ``iteration_time``.
  SSGD: a round is one iteration of every device, ``max t_i + c``, and ``sum b_i``
  samples. ASGD and DC-ASGD: no rounds, device i adds ``b_i / (t_i + c)`` samples per second.
* **Accuracy.** The test accuracy depends on the samples processed alone, whoever processed them
  and however they were grouped into rounds (i.i.d. shards; no staleness penalty): the run's own
  evaluations give ``S*``, the samples at which it first reached the target (interpolated
  between the checkpoints around the crossing). The model is available only at the end of a
  round, so a round mode reaches the target after ``ceil(S* / samples per round)`` rounds; an
  asynchronous one after ``S* / rate`` seconds.

What it leaves out: start-up, the first round's timing probe, a server link shared by more
devices, and the accuracy lost to long rounds (the model moves in fewer, larger steps): where a
slow device makes rounds very long, the measured time is later than predicted.
"""
from __future__ import annotations

import argparse
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

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_iteration / self.iteration_s


@dataclass(frozen=True)
class Prediction:
    devices: tuple[str, ...]
    samples_per_s: float      # while computing, over the subset
    round_s: float | None     # None for the asynchronous modes
    samples_per_round: float | None
    rounds: int | None
    time_s: float


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
    iterations = entry.get("k_list") or entry["self_iters_list"]
    iterations = sum(iterations)
    compute = sum(entry["compute_time_list"])
    exchange_s = statistics.median(entry["aggregate_time_list"])
    if iterations <= 0 or compute <= 0:
        # A device that sat out from the start (--sit-out-ratio) computed nothing; its speed is
        # its warm-up step's, which the round logs keep as its latest iteration time.
        timed = [t for t in entry.get("iteration_time_list") or [] if t]
        if not timed:
            raise AdviceError(f"device {name}: its logs hold no computed iteration")
        return Device(name=name, iteration_s=timed[-1], samples_per_iteration=batch_size,
                      exchange_s=exchange_s)
    return Device(name=name, iteration_s=compute / iterations,
                  samples_per_iteration=sum(entry["num_samples_list"]) / iterations,
                  exchange_s=exchange_s)


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
    return Run(folder=mode_dir, mode=mode, carry=bool(run.get("carry")), devices=devices,
               sit_out=sit_out,
               exchange_s=min(d.exchange_s for d in devices),
               samples_to_target=samples_to(summary.get("_evaluator"), target), target=target)


# ----------------------------------------------------------------------------- the model

def predict(run: Run, names) -> Prediction:
    """The predicted time to the target with only the devices ``names`` (see the docstring)."""
    devices = [d for d in run.devices if d.name in set(names)]
    c = run.exchange_s
    rate = sum(d.samples_per_s for d in devices)
    if run.mode in ASYNC_MODES:
        added = sum(d.samples_per_iteration / (d.iteration_s + c) for d in devices)
        return Prediction(tuple(d.name for d in devices), rate, None, None, None,
                          run.samples_to_target / added)
    names = tuple(d.name for d in devices)
    if run.mode == "sync":
        slowest = max(devices, key=lambda d: d.iteration_s)
        round_s = slowest.iteration_s + c
        per_round = sum(d.samples_per_iteration for d in devices)
        rounds = math.ceil(run.samples_to_target / per_round - 1e-9)
        return Prediction(names, rate, round_s, per_round, rounds, rounds * round_s)
    computing = computing_devices(devices, run.sit_out)
    first_s, first_samples = 0.0, 0.0
    if len(computing) < len(devices):
        # The first round lasts until every device has been timed (the slowest's probe),
        # while the others compute; those judged too slow by it compute nothing.
        first = max(d.iteration_s for d in devices) / esync_parts.PROBE_DIVISOR
        first_s = first + c
        first_samples = esync_round_samples(computing, first, c, run.carry)
    length = esync_round_length(computing, bounded=len(computing) < len(devices))
    per_round = esync_round_samples(computing, length, c, run.carry)
    left = max(0.0, run.samples_to_target - first_samples)
    rounds = math.ceil(left / per_round - 1e-9)
    rate = sum(d.samples_per_s for d in computing)
    return Prediction(names, rate, length + c, per_round, rounds + (first_s > 0),
                      first_s + rounds * (length + c))


def computing_devices(devices, sit_out: float) -> list[Device]:
    """The devices that compute after the first round: all but those over ``sit_out`` times
    the fastest's iteration (``esync.coordination.rules.sitting_out_ranks``)."""
    if sit_out <= 0:
        return list(devices)
    fastest = min(d.iteration_s for d in devices)
    return [d for d in devices if d.iteration_s <= sit_out * fastest]


def esync_round_length(devices, *, bounded: bool) -> float:
    """One slowest iteration; while some device sits out, at least ``BOUNDED_ROUND_ITERATIONS``
    of the fastest's (``esync_parts.bounded_length``)."""
    times = [d.iteration_s for d in devices]
    return bounded_length(times) if bounded else max(times)


def esync_round_samples(devices, length: float, c: float, carry: bool) -> float:
    """Samples of one ESync round of ``length`` s: every device computes throughout; with
    ``--carry`` all but the slowest also through the exchange (``c`` s)."""
    slowest = max(devices, key=lambda d: d.iteration_s)
    samples = sum(d.samples_per_s for d in devices) * length
    if carry:
        samples += sum(d.samples_per_s for d in devices if d is not slowest) * c
    return samples


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
        found.append(("the fast devices alone", [m for m in everyone if m not in slow]))
    return found


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
        if whole.time_s <= p.time_s:
            why = (f"include {name}: without it {p.time_s:.1f} s, with it {whole.time_s:.1f} s; "
                   f"it adds {share:.1%} of the samples")
        else:
            why = (f"leave out {name}: it adds {share:.1%} of the samples but "
                   + (f"its {device.iteration_s:.2f} s iteration sets the rounds' length "
                      f"({whole.round_s:.2f} s against {p.round_s:.2f} s)"
                      if whole.round_s and p.round_s else "its updates cost more than they add")
                   + f": {p.time_s:.1f} s without it against {whole.time_s:.1f} s")
        verdicts.append({"device": name, "include": whole.time_s <= p.time_s, "why": why})
    best = min(predictions, key=lambda pair: pair[1].time_s)
    return {"predictions": predictions, "best": best, "verdicts": verdicts}


# ----------------------------------------------------------------------------- command line

def render(run: Run, advice: dict) -> list[str]:
    L = [f"{PROG}: {run.folder} ({run.mode}{', carry' if run.carry else ''}): "
         f"{len(run.devices)} devices; {run.samples_to_target:.0f} samples reached "
         f"{run.target:g}; one exchange {run.exchange_s:.3f} s",
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
                    "verdicts": advice["verdicts"], "best": advice["best"][0]}
    except AdviceError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(data, indent=1) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
