"""Timing and per-round logs in the original ESync's format (see docs/ARCHITECTURE.md).

Phase timers wait for MXNet's engine before reading the clock: MXNet executes asynchronously, so
without the wait a phase would only measure how long it took to *enqueue* work. They wait for the
model's arrays (``settle``), not for the whole engine: an exchange overlapped with the next round
(``--overlap``) is in flight in the engine too, and ``nd.waitall()`` would wait for it at the end
of every phase, which is exactly the wait overlap exists to hide.
"""
import json
import math
import time
from contextlib import contextmanager
from pathlib import Path

from mxnet import nd

from esync.common import runlayout
from esync.common.errors import UserError
from esync.common.files import atomic_write_text


class LogDirError(UserError):
    pass


def finite_or_null(log: dict) -> dict:
    """``log`` with every NaN or infinite top-level number as None: JSON has no NaN, and a
    diverged run's loss must still leave a log that every JSON reader (summary, jq) accepts."""
    return {key: None if isinstance(value, float) and not math.isfinite(value) else value
            for key, value in log.items()}


class RoundRecord:
    """Phase timings, sample count and extras of one round (one iteration in sync/async/local)."""

    def __init__(self, number: int, settle=nd.waitall):
        self.number = number
        self.settle = settle        # waits for the work a phase must include (see the module)
        self.time: dict[str, dict[str, float]] = {}
        self.num_samples = 0
        self.extras: dict = {}
        self._index = -1

    def begin_iteration(self) -> None:
        self._index += 1
        self.time[str(self._index)] = {}

    def drop_empty_iteration(self) -> None:
        key = str(self._index)
        if key in self.time and not self.time[key]:
            del self.time[key]
            self._index -= 1

    @contextmanager
    def phase(self, name: str):
        self.settle()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.settle()
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        current = self.time[str(self._index)]
        current[name] = round(current.get(name, 0.0) + seconds, 6)

    def current(self) -> dict:
        return self.time[str(self._index)]

    def seconds(self, *names: str) -> float:
        return sum(p.get(n, 0.0) for p in self.time.values() for n in names)


class RoundLogWriter:
    """Writes round logs (``runlayout.round_log``) into ``<log_dir>/<network>/<mode_dir>/<host>/<device>/``.

    Refuses to start in a folder that already holds logs unless ``overwrite`` (delete them first)
    or ``resume`` (keep them and continue the numbering) is given: an earlier run's logs are never
    silently lost.
    """

    def __init__(self, folder: Path, *, overwrite: bool = False, resume: bool = False):
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            existing = sorted(runlayout.round_logs(self.folder).values())
            if existing and not (overwrite or resume):
                raise LogDirError(
                    f"{self.folder} already holds {len(existing)} log files of an earlier run; "
                    "choose another --log-dir, or pass --overwrite to replace them "
                    "(or --resume to continue that run)")
            if existing and overwrite and not resume:
                for f in existing:
                    f.unlink()
            probe = self.folder / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise LogDirError(f"log folder {self.folder} is not writable: {exc.strerror}") from None

    def write(self, record: RoundRecord, total_time: float, accuracy: float | None = None) -> Path:
        log = {"num_iters": record.number, "time": record.time,
               "num_samples": record.num_samples, "total_time": round(total_time, 6)}
        if accuracy is not None:
            log["accuracy"] = accuracy
        log.update(record.extras)
        path = runlayout.round_log(self.folder, record.number)
        return atomic_write_text(path, json.dumps(finite_or_null(log), allow_nan=False))
