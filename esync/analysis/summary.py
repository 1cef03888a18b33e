"""Summarise the per-device round logs of one run into one JSON file (as the original's summary.py).

Run from the repository root::

    python analysis/summary.py -b logs -n lenet -m esync      # -> logs/lenet/esync/ESync.json
    python analysis/summary.py -b logs -n lenet -m sync-niid  # -> .../sync-niid/Sync-Non-IID.json

It reads every ``<host>/<device>/iter-<n>.txt`` under ``<logs>/<network>/<mode_dir>/`` (the format
is fixed in ``docs/ARCHITECTURE.md``), whatever hosts and devices exist, and writes::

    {"<host>": {"<device>": {per-device lists and figures}},   # the original's layout
     "_totals": {...},        # cluster throughput, traffic, mean computing-time ratio
     "_evaluator": {...},     # only when <mode_dir>/evaluations.jsonl exists
     "_run": {...}}           # only when <mode_dir>/run.json exists

Per device, the original's keys (``accuracy_list``, ``num_samples_list``, ``self_iters_list``,
``elapsed_time_list``, ``aggregate_time_list``) keep their meaning; ``elapsed_time_list`` keeps the
logged seconds unrounded (the original rounded to whole seconds, too coarse for short runs).
Extras: one list per round for each extra log key (null when the logs do not carry it), the
scalars ``slowdown`` and ``rank``, and the derived ``throughput`` (samples/s),
``computing_time_ratio`` (computing seconds / last ``total_time``) and ``traffic_bytes_per_s``.
Logs in the original's format have no ``compute_time``: their computing time is then the sum of
the phases that are neither aggregation nor coordination (see ``NON_COMPUTE_PHASES``), and
``compute_time_source`` says which way each device's figure was obtained.

Bad input (missing or empty folder, a gap in the numbering, a corrupt file, a missing key) raises
``LogError`` whose message names the file; ``main`` prints it on one line and exits with code 2.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from esync.common import modes, runlayout
from esync.common.argtypes import HelpFormatter
from esync.common.files import atomic_open


REQUIRED_KEYS = ("time", "num_samples", "total_time")
AGGREGATE_PHASES = ("global update", "global aggregate")  # esync; sync/async
# Phases that are not computation: aggregation, talking to the state server, evaluating.
NON_COMPUTE_PHASES = frozenset(
    {"global update", "global aggregate", "check ready", "reset state server", "evaluation"})

# Extra per-round log keys (absent in the original's logs) -> the summary's list name.
EXTRA_LIST_KEYS = {
    "k": "k_list",
    "compute_time": "compute_time_list",
    "slowdown_time": "slowdown_time_list",
    "wait_time": "wait_time_list",
    "bytes_pushed": "bytes_pushed_list",
    "bytes_pulled": "bytes_pulled_list",
    "state_requests": "state_requests_list",
    "iteration_time": "iteration_time_list",
    "carried_iterations": "carried_iterations_list",
}
EXTRA_SCALAR_KEYS = ("slowdown", "rank")



class LogError(Exception):
    """A log folder or file that cannot be summarised; the message names it and what is wrong."""


# ----------------------------------------------------------------------------- names and files

def summary_name(mode_dir_name: str) -> str:
    """The original's summary file name for a mode folder: ``esync-niid`` -> ``ESync-Non-IID.json``.

    A folder name outside the known modes keeps its own name (``foo`` -> ``foo.json``).
    """
    return modes.summary_file(mode_dir_name)


def split_mode(mode_dir_name: str) -> tuple[str, bool]:
    """``"sync-niid"`` -> ``("sync", True)``; ``"sync"`` -> ``("sync", False)``.

    True for every non-i.i.d. split the mode registry knows.
    """
    base, split = modes.parse_folder(mode_dir_name)
    return base, split.value != 0


def find_device_dirs(mode_dir: Path) -> dict[str, dict[str, Path]]:
    """``{host: {device: folder}}`` for every ``<host>/<device>/`` holding at least one iter file.

    Folders without iter files (a checkpoint folder, a worker that never finished a round) and
    hidden or underscore-prefixed names are not devices.
    """
    found: dict[str, dict[str, Path]] = {}
    for host_dir in _subdirs(mode_dir):
        for device_dir in _subdirs(host_dir):
            if runlayout.round_logs(device_dir):
                found.setdefault(host_dir.name, {})[device_dir.name] = device_dir
    return found


def _subdirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")))


def iter_files(device_dir: Path) -> list[Path]:
    """The device's ``iter-1.txt`` ... ``iter-<n>.txt`` in order; a gap raises ``LogError``."""
    numbers = runlayout.round_logs(device_dir)
    for n in range(1, max(numbers, default=0) + 1):
        if n not in numbers:
            raise LogError(f"{runlayout.round_log(device_dir, n)}: missing (the numbering has a "
                           f"gap; found up to {runlayout.round_log(device_dir, max(numbers)).name})")
    return [numbers[n] for n in sorted(numbers)]


# ----------------------------------------------------------------------------- reading one file

def _load_json(path: Path, text: str | None = None, where: str | None = None):
    where = where or str(path)
    try:
        if text is None:
            text = path.read_text(encoding="utf-8")
        # NaN and Infinity (earlier esync wrote NaN for a diverged loss) load as floats; every
        # key the summary uses must be a finite number, and its check names the key.
        return json.loads(text)
    except UnicodeDecodeError:
        raise LogError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise LogError(f"{where}: corrupt JSON ({exc.msg} at line {exc.lineno} "
                       f"column {exc.colno})") from None
    except ValueError as exc:
        raise LogError(f"{where}: corrupt JSON ({exc})") from None


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _number(where: str, key: str, value, *, minimum: float | None = 0.0,
            maximum: float | None = None) -> float:
    if not _is_number(value):
        raise LogError(f"{where}: key {key!r} must be a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise LogError(f"{where}: key {key!r} must be >= {minimum:g}, got {value!r}")
    if maximum is not None and value > maximum:
        raise LogError(f"{where}: key {key!r} must be <= {maximum:g}, got {value!r}")
    return value


def _check_time(where: str, time) -> None:
    if not isinstance(time, dict) or not time:
        raise LogError(f"{where}: key 'time' must be a non-empty object of local iterations")
    for index, phases in time.items():
        try:
            int(index)
        except ValueError:
            raise LogError(f"{where}: key 'time' has a non-integer iteration {index!r}") from None
        if not isinstance(phases, dict):
            raise LogError(f"{where}: key 'time'/{index!r} must be an object of phase seconds")
        for phase, seconds in phases.items():
            _number(where, f"time/{index}/{phase}", seconds)


def read_round(path: Path) -> dict:
    """One validated ``iter-<n>.txt`` record; anything unusable raises ``LogError`` naming it."""
    record = _load_json(path)
    where = str(path)
    if not isinstance(record, dict):
        raise LogError(f"{where}: expected a JSON object, got {type(record).__name__}")
    for key in REQUIRED_KEYS:
        if key not in record:
            raise LogError(f"{where}: missing required key {key!r}")
    _check_time(where, record["time"])
    _number(where, "num_samples", record["num_samples"])
    _number(where, "total_time", record["total_time"])
    if record.get("accuracy") is not None:
        _number(where, "accuracy", record["accuracy"], maximum=1.0)
    for key in (*EXTRA_LIST_KEYS, *EXTRA_SCALAR_KEYS):
        if record.get(key) is not None:
            _number(where, key, record[key], minimum=None if key == "rank" else 0.0)
    return record


# ----------------------------------------------------------------------------- collecting

def collect(mode_dir) -> dict:
    """``{host: {device: {n: record}}}`` for every device log under ``mode_dir``, validated."""
    mode_dir = Path(mode_dir)
    if not mode_dir.is_dir():
        raise LogError(f"{mode_dir}: mode folder not found")
    devices = find_device_dirs(mode_dir)
    if not devices:
        raise LogError(f"{mode_dir}: no device logs (expected <host>/<device>/"
                       f"{runlayout.ROUND_LOG_PATTERN})")
    merged: dict = {}
    for host, by_device in devices.items():
        for device, device_dir in by_device.items():
            files = iter_files(device_dir)
            merged.setdefault(host, {})[device] = {
                n: read_round(path) for n, path in enumerate(files, start=1)}
    return merged


def read_evaluations(path: Path) -> dict | None:
    """The evaluator's records as parallel lists, or None when the file does not exist."""
    if not path.exists():
        return None
    lists = {"round_list": [], "elapsed_time_list": [], "accuracy_list": [], "samples_list": []}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise LogError(f"{path}: not UTF-8 text") from None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path} line {lineno}"
        record = _load_json(path, line, where)
        if not isinstance(record, dict):
            raise LogError(f"{where}: expected a JSON object")
        for key in ("round", "total_time", "accuracy"):
            if key not in record:
                raise LogError(f"{where}: missing required key {key!r}")
        lists["round_list"].append(_number(where, "round", record["round"]))
        lists["elapsed_time_list"].append(_number(where, "total_time", record["total_time"]))
        lists["accuracy_list"].append(_number(where, "accuracy", record["accuracy"], maximum=1.0))
        samples = record.get("samples")
        lists["samples_list"].append(None if samples is None
                                     else _number(where, "samples", samples))
    # The evaluator appends rounds it caught up on after newer ones: present them in order.
    order = sorted(range(len(lists["round_list"])),
                   key=lambda i: (lists["elapsed_time_list"][i], lists["round_list"][i]))
    return {key: [values[i] for i in order] for key, values in lists.items()}


def read_run(path: Path) -> dict | None:
    """The job's resolved config (``run.json``), or None when the file does not exist."""
    if not path.exists():
        return None
    run = _load_json(path)
    if not isinstance(run, dict):
        raise LogError(f"{path}: expected a JSON object")
    return run


# ----------------------------------------------------------------------------- summarising

def derived_compute_time(time: dict) -> float:
    """Computing seconds of one round from its phases (for logs without ``compute_time``)."""
    return sum(seconds for phases in time.values() for phase, seconds in phases.items()
               if phase not in NON_COMPUTE_PHASES)


def aggregate_time(time: dict) -> float:
    """The aggregation seconds held by the last key of ``time`` (0 for standalone training)."""
    last = time[max(time, key=int)]
    for phase in AGGREGATE_PHASES:
        if phase in last:
            return last[phase]
    return 0.0


def _ratio(numerator: float | None, denominator: float) -> float | None:
    if numerator is None or denominator <= 0:
        return None
    return numerator / denominator


def _complete_sum(values: list | None) -> float | None:
    if values is None or any(v is None for v in values):
        return None
    return sum(values)


def summarize_device(records: list[dict]) -> dict:
    """The per-device entry of a summary from its rounds in order."""
    evaluated = [r for r in records if r.get("accuracy") is not None]
    entry = {
        "accuracy_list": [r["accuracy"] for r in evaluated],
        "num_samples_list": [r["num_samples"] for r in records],
        "self_iters_list": [len(r["time"]) for r in records],
        "elapsed_time_list": [r["total_time"] for r in records],
        "aggregate_time_list": [aggregate_time(r["time"]) for r in records],
        "accuracy_time_list": [r["total_time"] for r in evaluated],
    }
    for key, name in EXTRA_LIST_KEYS.items():
        values = [r.get(key) for r in records]
        entry[name] = None if all(v is None for v in values) else values

    logged = entry["compute_time_list"]
    entry["compute_time_list"] = [
        r["compute_time"] if r.get("compute_time") is not None else derived_compute_time(r["time"])
        for r in records]
    n_logged = 0 if logged is None else sum(v is not None for v in logged)
    entry["compute_time_source"] = ("logged" if n_logged == len(records)
                                    else "phases" if n_logged == 0 else "mixed")

    for key in EXTRA_SCALAR_KEYS:
        values = [r[key] for r in records if r.get(key) is not None]
        entry[key] = values[-1] if values else None

    wall = records[-1]["total_time"]
    pushed = _complete_sum(entry["bytes_pushed_list"])
    pulled = _complete_sum(entry["bytes_pulled_list"])
    entry["throughput"] = _ratio(sum(entry["num_samples_list"]), wall)
    entry["computing_time_ratio"] = _ratio(sum(entry["compute_time_list"]), wall)
    entry["traffic_bytes_per_s"] = _ratio(
        None if pushed is None or pulled is None else pushed + pulled, wall)
    return entry


def device_entries(summary: dict):
    """Yield ``(host, device, entry)`` for the device entries of a summary (not the ``_`` keys)."""
    for host, by_device in summary.items():
        if host.startswith("_") or not isinstance(by_device, dict):
            continue
        for device, entry in by_device.items():
            if isinstance(entry, dict):
                yield host, device, entry


def totals(summary: dict) -> dict:
    """Cluster figures over the device entries of a summary.

    ``wall_time`` is the longest ``total_time`` of any device (workers start together);
    throughput and traffic are cluster sums over it; ``state_requests_per_round`` is per worker
    and round. Figures the logs cannot give are null.
    """
    entries = [e for _, _, e in device_entries(summary)]
    wall = max((e["elapsed_time_list"][-1] for e in entries if e["elapsed_time_list"]), default=0)
    samples = sum(sum(e["num_samples_list"]) for e in entries)
    per_device = {name: [_complete_sum(e.get(name)) for e in entries]
                  for name in ("bytes_pushed_list", "bytes_pulled_list", "state_requests_list")}
    sums = {name: None if any(v is None for v in vals) else sum(vals)
            for name, vals in per_device.items()}
    pushed, pulled = sums["bytes_pushed_list"], sums["bytes_pulled_list"]
    ratios = [e.get("computing_time_ratio") for e in entries]
    ratios = [r for r in ratios if r is not None]
    rounds = sum(len(e["num_samples_list"]) for e in entries)
    return {
        "num_devices": len(entries),
        "samples": samples,
        "wall_time": wall,
        "throughput": _ratio(samples, wall),
        "bytes_pushed": pushed,
        "bytes_pulled": pulled,
        "traffic_bytes_per_s": _ratio(
            None if pushed is None or pulled is None else pushed + pulled, wall),
        "mean_computing_time_ratio": sum(ratios) / len(ratios) if ratios else None,
        "state_requests_per_round": _ratio(sums["state_requests_list"], rounds),
    }


def summarize(mode_dir) -> dict:
    """The summary of one mode folder (see the module docstring for its layout)."""
    mode_dir = Path(mode_dir)
    merged = collect(mode_dir)
    summary: dict = {}
    for host, by_device in merged.items():
        summary[host] = {device: summarize_device([rounds[n] for n in sorted(rounds)])
                         for device, rounds in by_device.items()}
    summary["_totals"] = totals(summary)
    evaluations = read_evaluations(runlayout.evaluations_file(mode_dir))
    if evaluations is not None:
        summary["_evaluator"] = evaluations
    run = read_run(runlayout.run_file(mode_dir))
    if run is not None:
        summary["_run"] = run
    return summary


def write_summary(mode_dir) -> Path:
    """Summarise ``mode_dir`` and write the summary atomically beside its host folders."""
    mode_dir = Path(mode_dir)
    summary = summarize(mode_dir)
    target = mode_dir / summary_name(mode_dir.name)
    with atomic_open(target, "w", encoding="utf-8") as fp:
        json.dump(summary, fp)
        fp.write("\n")
    return target


def load_summary(path) -> dict:
    """Read a summary JSON written by ``write_summary`` (or by the original's summary.py)."""
    path = Path(path)
    summary = _load_json(path)
    if not isinstance(summary, dict):
        raise LogError(f"{path}: expected a JSON object")
    return summary


# ----------------------------------------------------------------------------- command line

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="summary.py",
        description="Summarise <base>/<network>/<mode>/<host>/<device>/"
                    f"{runlayout.ROUND_LOG_PATTERN} into "
                    "<base>/<network>/<mode>/<Name>.json (e.g. ESync.json).",
        formatter_class=HelpFormatter)
    parser.add_argument("-b", "--base-dir", default="logs", help="the log folder")
    parser.add_argument("-n", "--network", required=True, help="network folder, e.g. resnet18-v1")
    parser.add_argument("-m", "--mode", required=True,
                        help="mode folder: esync, sync, async, dcasgd, local, or one of them "
                             "with -niid")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    mode_dir = Path(args.base_dir) / args.network / args.mode
    try:
        path = write_summary(mode_dir)
        summary = load_summary(path)
    except (LogError, OSError) as exc:
        print(f"summary: error: {exc}", file=sys.stderr)
        return 2
    t = summary["_totals"]
    throughput = "n/a" if t["throughput"] is None else f"{t['throughput']:.1f} samples/s"
    print(f"summary: wrote {path} ({t['num_devices']} devices, throughput {throughput})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
