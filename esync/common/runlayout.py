"""The run folder's layout, in one place: every reader and writer asks this module for paths.

    <log_dir>/<network>/<mode folder>/         one job (``mode_dir``; ``-s`` adds a suffix)
        <host>/<device>/iter-<n>.txt            one JSON file per round, the original's format
        <host>/<device>/config.json             the worker's resolved flags
        run.json                                rank 0's run configuration
        cluster.json                            the launcher's configuration (esync-cluster)
        evaluations.jsonl                       the evaluator's scores, one line per checkpoint
        checkpoints/                            rank 0's checkpoints, scored by the evaluator
        processes/                              every process's output (esync-cluster)
        state_server.sqlite3                    the state server's history (-m esync)

The folder names ``checkpoints`` and ``processes`` are reserved: no host is called that.
Plain Python: the launcher and the analysis tools read logs without loading MXNet.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator

from esync.common import modes

ROUND_LOG = re.compile(r"iter-(\d+)\.txt")
ROUND_LOG_GLOB = "iter-*.txt"
ROUND_LOG_PATTERN = "iter-N.txt"          # how help texts name a round log
EVALUATIONS = "evaluations.jsonl"
CHECKPOINTS = "checkpoints"
PROCESSES = "processes"
RUN_FILE = "run.json"
CLUSTER_FILE = "cluster.json"
LINKS_FILE = "links.json"      # bytes each emulated host's link carried (--net netns)
CONFIG_FILE = "config.json"
STATE_DB = "state_server.sqlite3"
RESERVED = (CHECKPOINTS, PROCESSES)      # folders of a mode folder that are not hosts


def mode_dir(args) -> Path:
    """``<log_dir>/<network>/<mode folder>`` of a parsed main.py / esync-cluster namespace."""
    return (Path(args.log_dir) / args.network
            / modes.folder_name(args.mode, args.use_dcasgd, args.split_by_class))


def device_dir(mode_folder: Path, host: str, device: str) -> Path:
    return Path(mode_folder) / host / device


def checkpoints_dir(mode_folder: Path) -> Path:
    return Path(mode_folder) / CHECKPOINTS


def processes_dir(mode_folder: Path) -> Path:
    return Path(mode_folder) / PROCESSES


def evaluations_file(mode_folder: Path) -> Path:
    return Path(mode_folder) / EVALUATIONS


def run_file(mode_folder: Path) -> Path:
    return Path(mode_folder) / RUN_FILE


def cluster_file(mode_folder: Path) -> Path:
    return Path(mode_folder) / CLUSTER_FILE


def links_file(mode_folder: Path) -> Path:
    return Path(mode_folder) / LINKS_FILE


def state_db(mode_folder: Path) -> Path:
    return Path(mode_folder) / STATE_DB


def round_log(folder: Path, number: int) -> Path:
    """``<device folder>/iter-<number>.txt``."""
    return Path(folder) / f"iter-{number}.txt"


def round_number(path) -> int | None:
    """The round of a round log's file name, None for any other file."""
    match = ROUND_LOG.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def round_logs(folder: Path) -> dict[int, Path]:
    """{round: path} of one device folder's round logs (empty when the folder is missing)."""
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return {}
    return {n: p for p in entries if (n := round_number(p)) is not None}


def has_round_logs(folder: Path) -> bool:
    return any(True for _ in Path(folder).glob(ROUND_LOG_GLOB))


def device_round_logs(mode_folder: Path) -> Iterator[tuple[str, str, int, Path]]:
    """(host, device, round, path) of every round log under a mode folder."""
    for log in Path(mode_folder).glob(f"*/*/{ROUND_LOG_GLOB}"):
        host = log.parent.parent.name
        number = round_number(log)
        if host not in RESERVED and number is not None:
            yield host, log.parent.name, number, log


def any_round_logs(mode_folder: Path) -> bool:
    return next(device_round_logs(mode_folder), None) is not None


class EvaluationLog:
    """Append-only ``evaluations.jsonl``; readers take the latest accuracy from it."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._latest_round = -1
        self.latest_accuracy: float | None = None

    def append(self, entry: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def lines(self) -> list[str]:
        """Every non-empty line (none when the file does not exist yet)."""
        try:
            return [ln for ln in self.path.read_text().splitlines() if ln.strip()]
        except FileNotFoundError:
            return []

    def poll(self) -> float | None:
        """Read lines appended since the last call; return the accuracy of the newest round.

        The evaluator may append an older round after a newer one (catching up); that older
        score does not replace the newer one.
        """
        try:
            with open(self.path) as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.latest_accuracy
        complete = chunk[:chunk.rfind("\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                entry = json.loads(line)
                accuracy, round_no = float(entry["accuracy"]), entry.get("round")
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            round_no = round_no if isinstance(round_no, int) else self._latest_round
            if round_no >= self._latest_round:
                self._latest_round, self.latest_accuracy = round_no, accuracy
        return self.latest_accuracy
