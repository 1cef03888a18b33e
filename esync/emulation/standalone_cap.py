"""Which slow-device emulation the runs used, and one device alone under the x1 device's cap.

The launcher emulates a xF device either by CPU caps (its worker in a cgroup limited to S/F of a
core) or by sleeping (F-1) times each step's compute. Which one ran is a fact of each run, read
back from the ``cluster.json`` the launcher writes in the run's mode folder (a launcher that
writes none predates caps: it slept). The report states it, because the two emulations give
different absolute speeds and different physical limits.

Standalone SGD (``main.py -m local``, started by the benchmark itself) must be *one of the
cluster's devices*: when the cluster runs capped, a x1 device has S cores, so the standalone run
gets the same cap (a cgroup of its own, one compute thread); otherwise it would be a device
1/S times faster than any in the cluster and every "vs standalone" figure would be off by that.
``esync.emulation.cgroups`` (the launcher's caps) does the capping; it is imported inside
functions so that this module loads where it cannot (a checkout without it).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from esync.common import runlayout

OLDER = "sleep (older launcher)"
DEVICE = "standalone"          # the cgroup's name for the standalone run


def _cgroups():
    """``esync.emulation.cgroups``, or None with the reason (this checkout may predate it)."""
    try:
        import esync.emulation.cgroups as cgroups
    except ImportError as exc:
        return None, f"this checkout has no usable esync.emulation.cgroups ({exc})"
    return cgroups, None


def cgroups_unavailable() -> str | None:
    """None when CPU caps can be used here, else why not (one phrase)."""
    cgroups, why = _cgroups()
    if cgroups is None:
        return why
    found = cgroups.find_cpu_controller()
    return found if isinstance(found, str) else None


def cores_here() -> int:
    """The cores this process may run on (what the launcher sizes its caps for)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def standalone_share(args) -> float:
    """The x1 device's cap: --cpu-share, else the launcher's default for these factors."""
    if args.cpu_share is not None:
        return args.cpu_share
    cgroups, why = _cgroups()
    if cgroups is None:
        raise RuntimeError(why)
    return cgroups.default_share(args.slowdowns, cores_here())


class StandaloneCap:
    """The standalone runs' CPU cap for the whole benchmark: a context manager.

    On entry it decides: capped (``prefix`` and ``env`` to give the standalone jobs, ``share``
    its cores) when the cluster runs may be capped (a launcher with ``--emulation``, not
    ``sleep``) and caps work here; otherwise uncapped, with ``reason`` saying why. ``info`` is
    what the report and benchmark.json say about it.
    """

    def __init__(self, args):
        self.args = args
        self.caps = None
        self.prefix: list[str] = []
        self.env: dict = {}
        self.share: float | None = None
        self.reason: str | None = None
        self.problem: str | None = None
        self.pin = getattr(args, "pinned", False)   # on one core, as the launcher's devices
        self.cpu: int | None = None

    def __enter__(self) -> "StandaloneCap":
        args = self.args
        if not args.launcher_emulation:
            self.reason = ("the launcher has no --emulation option: its devices sleep, so one "
                           "device alone runs on a whole core too")
            return self
        if args.emulation == "sleep":
            self.reason = "--emulation sleep"
            return self
        cgroups, why = _cgroups()
        if cgroups is None:
            self.reason = why
            return self
        try:
            share = standalone_share(args)
            caps = cgroups.CpuCaps()
        except (OSError, ValueError, RuntimeError, cgroups.CgroupsUnavailable) as exc:
            self.reason = f"CPU caps unavailable: {exc}"
            return self
        try:
            group = caps.cap(DEVICE, share)
        except (OSError, ValueError) as exc:
            caps.close()
            self.reason = f"capping the standalone run failed: {exc}"
            return self
        self.caps, self.share = caps, share
        # As the launcher's workers do: the run joins its group when its training starts
        # (imports and data loading at the machine's speed), and computes on one core where
        # the launcher pins its capped devices.
        from esync.common.speeds import CPU_CGROUP_ENV, CPU_PIN_ENV
        self.env = {**cgroups.ONE_COMPUTE_THREAD_ENV, CPU_CGROUP_ENV: str(group)}
        if self.pin:
            from esync.emulation.cgroups import place_on_cpus
            self.cpu = place_on_cpus([share], os.sched_getaffinity(0))[0]
            self.env[CPU_PIN_ENV] = str(self.cpu)
        return self

    def apply(self, jobs) -> None:
        """Give every standalone job the cap's prefix and environment."""
        for job in jobs:
            if job.standalone:
                job.prefix, job.env = list(self.prefix), dict(self.env)

    def __exit__(self, *exc) -> None:
        if self.caps is not None:
            try:
                self.caps.close()
            except OSError as err:      # the report still comes; the next run cleans up
                self.problem = f"removing the standalone run's cgroup: {err}"
            self.caps = None

    @property
    def info(self) -> dict:
        return {"capped": self.share is not None, "share": self.share, "reason": self.reason,
                "cpu": self.cpu, "env": self.env or None}


# ----------------------------------------------------------------------------- what ran

def read_cluster(folder: Path) -> dict | None:
    """The launcher's ``cluster.json`` of one run (None: absent or unreadable)."""
    try:
        return json.loads(runlayout.cluster_file(folder).read_text())
    except (OSError, ValueError):
        return None


def survey(jobs) -> dict:
    """What the cluster runs used: ``{"counts": {emulation: runs}, "shares": [...],
    "placement": [...] | None, "runs": n}`` over the jobs that ran a cluster."""
    counts: dict[str, int] = {}
    shares, slices, placement = set(), set(), None
    cluster = [j for j in jobs if not j.standalone and j.returncode is not None]
    for job in cluster:
        info = read_cluster(job.folder)
        if info is None:
            kind = OLDER
        else:
            kind = info.get("emulation") or OLDER
            if info.get("cpu_share") is not None:
                shares.add(round(float(info["cpu_share"]), 4))
            if info.get("cfs_slice_us"):
                slices.add(int(info["cfs_slice_us"]))
            if placement is None and not job.tuning and info.get("placement"):
                placement = info["placement"]
        counts[kind] = counts.get(kind, 0) + 1
    return {"counts": counts, "shares": sorted(shares), "slices": sorted(slices),
            "placement": placement, "runs": len(cluster)}


def describe(seen: dict, standalone: dict) -> list[str]:
    """Report lines: which emulation ran (and the share), how the standalone run matched it,
    and any mismatch between the two."""
    counts, shares = seen["counts"], seen["shares"]
    L = []
    if not counts:
        L.append("- emulation: n/a (no cluster run started)")
    else:
        parts = [f"{kind} in {n} run(s)" for kind, n in sorted(counts.items(),
                                                              key=lambda kv: -kv[1])]
        main = max(counts, key=counts.get)
        share = (f"; share S = {', '.join(f'{s:g}' for s in shares)} core per ×1 device "
                 "(a ×F device gets S/F)" if shares else "")
        slices = seen.get("slices") or []
        if slices:
            share += (f"; CFS bandwidth slice {', '.join(f'{s / 1000:g}' for s in slices)} ms "
                      "(a cap's period holds at least one)")
        source = ("no run wrote a cluster.json: the launcher predates them" if main == OLDER
                  else "read from each run's cluster.json")
        if len(counts) == 1:
            L.append(f"- emulation: **{main}** in every cluster run{share} ({source})")
        else:
            L.append(f"- emulation: **mixed**: {', '.join(parts)}{share} "
                     "(read from each run's cluster.json)")
    if standalone.get("capped"):
        where = (f", on CPU {standalone['cpu']}" if standalone.get("cpu") is not None
                 else "")
        L.append(f"- standalone SGD: capped at {standalone['share']:g} core (its own cgroup, "
                 f"one compute thread{where}): one of the cluster's ×1 devices")
    else:
        L.append(f"- standalone SGD: uncapped, a whole core and one thread "
                 f"({standalone.get('reason') or 'no caps'})")
    capped = counts.get("cpu-cap", 0)
    if capped and not standalone.get("capped"):
        L.append("- **mismatch**: the cluster ran capped but the standalone run did not, so "
                 "standalone SGD had a faster device than any in the cluster")
    elif standalone.get("capped") and shares and any(
            abs(s - standalone["share"]) > 1e-3 for s in shares):
        L.append(f"- **mismatch**: the cluster's share ({', '.join(f'{s:g}' for s in shares)}) "
                 f"differs from the standalone run's ({standalone['share']:g})")
    elif standalone.get("capped") and not capped and counts:
        L.append("- **mismatch**: the standalone run was capped but no cluster run was")
    if seen.get("placement"):
        cells = []
        for p in seen["placement"]:
            cores = p.get("cpu_cores")
            cells.append(f"{p.get('device')} ×{p.get('slowdown', 1):g}"
                         + (f": {cores:g} core" if cores is not None else "")
                         + (f" on CPU {p['cpu']}" if p.get("cpu") is not None else ""))
        L.append("- placement (first full run): " + ", ".join(cells))
    return L
