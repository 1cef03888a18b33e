"""Each real device measured alone, and one device alone run on the fastest: the part of
``--backend ssh``/``slurm`` that runs (``own_machines`` holds the flags, the checks and the
placement).

In the driver, ``RealDevices`` stands where the emulation's ``StandaloneCap`` stands on the
emulated box: entered before the first run, it runs one short standalone run per device
(``--probe-seconds`` of training, ``main.py -m local`` on that device, over ssh or as a Slurm
step) and records its median iteration time; then it gives every standalone job of the
benchmark the way to run on the fastest device.
"""
from __future__ import annotations

import shlex
import statistics
from pathlib import Path

from esync.benchmark import metrics, plan
from esync.benchmark.own_machines import PROBES_DIR, SETTING_NAME, PlacedDevice
from esync.benchmark.runs import run_job


def iteration_seconds(summary: dict) -> float | None:
    """A standalone run's median compute seconds per iteration, its first round (MXNet's
    warm-up: memory, kernels) left out."""
    from esync.analysis.summary import device_entries
    per_iteration = []
    for _, _, entry in device_entries(summary):
        computed = (entry.get("compute_time_list") or [])[1:]
        iterations = (entry.get("self_iters_list") or [])[1:]
        per_iteration += [c / max(1, k) for c, k in zip(computed, iterations) if c is not None]
    return statistics.median(per_iteration) if per_iteration else None


class ProbeFailed(RuntimeError):
    """A device's standalone run failed: the benchmark stops before its first run."""


class ProbeTicks:
    """``run_job``'s progress for a probe: a line every ``EVERY_S`` through the benchmark's."""

    EVERY_S = 15.0

    def __init__(self, progress, label: str):
        self.progress, self.label, self.shown = progress, label, 0.0

    def tick(self, job, elapsed: float) -> None:
        if elapsed - self.shown >= self.EVERY_S:
            self.shown = elapsed
            self.progress.note(f"measuring {self.label}: {elapsed:.0f}s elapsed")


class RealDevices:
    """What the emulation's ``StandaloneCap`` is on the emulated box, for real devices: a
    context manager that, on entry, measures each device alone (``probe``), then gives every
    standalone job (``apply``) the way to run on the fastest device. Nothing is capped."""

    share = None                 # no CPU cap: the physical limit counts whole devices

    def __init__(self, args, out: Path, progress):
        self.args, self.machines = args, args.machines
        self.out, self.progress = Path(out), progress
        self.problem: str | None = None

    def __enter__(self) -> "RealDevices":
        self.probe()
        return self

    def __exit__(self, *exc) -> bool:
        return False

    @property
    def reason(self) -> str:
        device = self.machines.standalone_device()
        return (f"a real device, as it is: {device.label}"
                + (" (the fastest measured)" if self.machines.fastest else ""))

    @property
    def info(self) -> dict:
        device = self.machines.standalone_device()
        return {"capped": False, "share": None, "reason": self.reason,
                "host": device.host, "device": device.device}

    def probe_job(self, device: PlacedDevice):
        """A short standalone run on `device` (``--probe-seconds`` of training, no scoring
        before its end)."""
        args = self.args
        name = f"{device.device}@{device.target}".replace(" ", "-").replace("/", "-")
        row = plan.Row(name=f"probe-{name}", label=f"probe of {device.label}", mode="local",
                       split=0, group=f"probe-{name}")
        root = self.out / PROBES_DIR / name
        setting = plan.Setting(SETTING_NAME, self.machines.setting_label)
        job = plan._job(args, row, setting, 0, args.learning_rate, root,
                        args.probe_seconds, self.out / "runs" / f"probe-{name}.log")
        at = job.argv.index("-e")
        job.argv[at + 1] = str(10 ** 9)
        job.prefix, job.argv = self.machines.on_device(device, job.argv)
        return job

    def probe(self) -> None:
        """Each device's iteration time alone, one after the other (nothing else runs); a
        device that fails alone stops the benchmark (``ProbeFailed``)."""
        failed = []
        for device in self.machines.distinct:
            job = self.probe_job(device)
            self.progress.note(f"measuring {device.label} alone ({self.args.probe_seconds:g} s "
                               "of training)")
            run_job(job, ProbeTicks(self.progress, device.label),
                    timeout=self.args.probe_seconds * 2 + 300)
            if job.error is None:
                metrics.summarise(job)
            seconds = iteration_seconds(job.summary) if job.ok else None
            self.machines.probes[device.key] = {
                "iteration_s": seconds, "log": str(job.log.relative_to(self.out)),
                "error": job.error if seconds is None else None,
                "command": shlex.join(job.prefix + job.argv)}
            if seconds is None:
                failed.append(f"{device.label} ({job.error or 'no iteration timed'}; see "
                              f"{job.log})")
            else:
                self.progress.note(f"{device.label}: {seconds * 1e3:.1f} ms per iteration")
        timed = [d for d in self.machines.distinct if self.machines.iteration_s(d)]
        self.machines.fastest = min(timed, key=self.machines.iteration_s) if timed else None
        self.args.slowdowns = self.machines.slowdowns()
        if failed:
            raise ProbeFailed("a device cannot train alone, so every run with it would fail: "
                              + "; ".join(failed) + ". Fix that device (its log says why) or "
                              "leave it out of the cluster")

    def apply(self, jobs) -> None:
        """Every standalone job runs on the fastest device (prefix and argv to reach it)."""
        for job in jobs:
            if job.standalone and not job.prefix:
                job.prefix, job.argv = self.machines.on_device(
                    self.machines.standalone_device(), job.argv)
