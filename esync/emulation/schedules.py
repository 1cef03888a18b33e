"""Speed schedules: emulated devices whose speed changes during a run.

``--speed-schedule cpu1:1@0,6@30;cpu2:2@10``: device ``cpu1`` runs at x1 from 0 s and x6 from
30 s of training, ``cpu2`` at x2 from 10 s (before its first change a device keeps its
``--slowdown``). The launcher changes a CPU-capped device's quota when its factor changes
(``esync.emulation.cgroups.SpeedShifter``); a worker emulating by sleeping changes its own
factor; both log the factor in force. Plain Python, shared by the worker and the launcher.
"""
from __future__ import annotations

import bisect
import math
import re

from esync.common.errors import UsageError

DEVICE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class ScheduleError(UsageError, ValueError):
    """A speed schedule that does not parse; the message names the token and the format."""


SCHEDULE_FORMAT = ("DEVICE:FACTOR@SECONDS[,FACTOR@SECONDS...][;DEVICE:...], "
                   "e.g. cpu1:1@0,6@30;cpu2:2@10")


def _number(token: str, what: str, entry: str) -> float:
    try:
        value = float(token)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ScheduleError(f"speed schedule: {what} {token!r} in {entry!r} is not a number; "
                            f"expected {SCHEDULE_FORMAT}")
    return value


def parse_speed_schedule(text: str, devices=None) -> dict[str, list[tuple[float, float]]]:
    """``"cpu1:1@0,6@30;cpu2:2@10"`` -> ``{"cpu1": [(0.0, 1.0), (30.0, 6.0)], "cpu2":
    [(10.0, 2.0)]}``: for each device, (seconds since the start, slow-down factor) by time.

    A factor is how many times slower than a x1 device (>= 1); seconds are >= 0. With
    ``devices`` given, a device not among them is an error too. ScheduleError (a ValueError
    and a UsageError) names the bad token and shows the expected format.
    """
    known = None if devices is None else list(devices)
    schedule: dict[str, list[tuple[float, float]]] = {}
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        device, colon, points = (s.strip() for s in entry.partition(":"))
        if not colon or not device or not points:
            raise ScheduleError(f"speed schedule: {entry!r} is not DEVICE:FACTOR@SECONDS,...; "
                                f"expected {SCHEDULE_FORMAT}")
        if not DEVICE_RE.match(device):
            raise ScheduleError(f"speed schedule: {device!r} in {entry!r} is not a device name "
                                "(letters, digits, '_' and '-')")
        if known is not None and device not in known:
            raise ScheduleError(f"speed schedule: no device {device!r} in this run; devices: "
                                f"{', '.join(known)}")
        if device in schedule:
            raise ScheduleError(f"speed schedule: device {device!r} appears twice; give all "
                                f"its changes in one entry, e.g. {device}:1@0,4@30")
        changes = {}
        for point in (p.strip() for p in points.split(",")):
            factor, at, seconds = (s.strip() for s in point.partition("@"))
            if not at or not factor or not seconds:
                raise ScheduleError(f"speed schedule: {point!r} in {entry!r} is not "
                                    f"FACTOR@SECONDS; expected {SCHEDULE_FORMAT}")
            f = _number(factor, "factor", entry)
            t = _number(seconds, "time", entry)
            if f < 1:
                raise ScheduleError(f"speed schedule: factor {factor!r} in {entry!r} must be "
                                    ">= 1 (how many times slower than a x1 device)")
            if t < 0:
                raise ScheduleError(f"speed schedule: time {seconds!r} in {entry!r} must be "
                                    ">= 0 seconds since the start")
            if t in changes:
                raise ScheduleError(f"speed schedule: two factors at {seconds} s in {entry!r}")
            changes[t] = f
        schedule[device] = sorted(changes.items())
    if not schedule:
        raise ScheduleError(f"speed schedule {text!r} is empty; expected {SCHEDULE_FORMAT}")
    return schedule


def factor_in_force(changes: list[tuple[float, float]], elapsed: float,
                    initial: float = 1.0) -> float:
    """The factor of one device's ``changes`` (sorted (seconds, factor)) ``elapsed`` seconds
    after the start: the latest change at or before then, ``initial`` before the first."""
    i = bisect.bisect_right([t for t, _ in changes], elapsed)
    return changes[i - 1][1] if i else initial


def next_change(changes: list[tuple[float, float]], elapsed: float) -> float | None:
    """When (seconds since the start) the next change after ``elapsed`` happens; None: none."""
    i = bisect.bisect_right([t for t, _ in changes], elapsed)
    return changes[i][0] if i < len(changes) else None
