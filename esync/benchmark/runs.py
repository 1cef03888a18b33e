"""Running the benchmark's subprocesses one after the other, with progress and clean stops.

Each finished run leaves a record beside its log (``record_path``: its command, exit code and
seconds), so that ``--resume`` keeps the runs an interrupted benchmark had finished and runs
only the others."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from esync.benchmark.plan import REPO, Job, child_env
from esync.common.files import atomic_write_text
from esync.common.procs import die_with_parent, kill_group

PROG = "esync-benchmark"
TAIL_LINES = 25


class Progress:
    """Which run, its elapsed time: a tqdm bar on a terminal, a plain line every 15 s otherwise."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream = total, stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self.bar = None
        self.last_line = 0.0
        self.index = 0
        if self.tty:
            from tqdm import tqdm
            try:
                size = os.get_terminal_size(self.stream.fileno())
            except (OSError, ValueError, AttributeError):
                size = os.terminal_size((0, 0))
            # A pseudo-terminal that reports a 0x0 size would get no bar at all from tqdm.
            sized = size.columns > 0 and size.lines > 0
            self.bar = tqdm(total=total, unit="run", file=self.stream, dynamic_ncols=sized,
                            ncols=None if sized else 100, nrows=None if sized else 24,
                            bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} runs{postfix}")

    def _line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(f"{PROG}: {text}", file=self.stream)
        else:
            print(f"{PROG}: {text}", file=self.stream, flush=True)

    def _tag(self, job: Job) -> str:
        return f"[{self.index}/{self.total}] {job.tag}"

    def extend(self, runs: int) -> None:
        """More runs than planned (a widened learning-rate grid)."""
        self.total += runs
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def begin(self, job: Job) -> None:
        self.index += 1
        self.last_line = time.monotonic()
        if self.bar is not None:
            self.bar.set_description_str(self._tag(job))
            self.bar.set_postfix_str("starting")
        elif not job.kept:
            self._line(f"{self._tag(job)}: started")

    def tick(self, job: Job, elapsed: float) -> None:
        now = time.monotonic()
        total = now - self.start
        if self.bar is not None:
            self.bar.set_postfix_str(f"{elapsed:.0f}s in this run, {total:.0f}s in all")
        elif now - self.last_line >= 15:
            self.last_line = now
            self._line(f"{self._tag(job)}: {elapsed:.0f}s elapsed ({total:.0f}s in all)")

    def end(self, job: Job, left: float | None = None) -> None:
        verdict = ("kept from the earlier invocation (--resume)" if job.kept
                   else "done" if job.error is None else f"FAILED: {job.error}")
        eta = f"; about {left / 60:.0f} min left" if left is not None and left >= 60 else ""
        took = "" if job.kept else f" after {job.seconds:.0f}s"
        self._line(f"{self._tag(job)}: {verdict}{took}{eta}")
        if self.bar is not None:
            self.bar.update(1)

    def note(self, text: str) -> None:
        self._line(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM (the launcher then stops its cluster), SIGKILL to the group after `grace` s."""
    kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_group(proc, signal.SIGKILL)
        proc.wait()


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def record_path(job: Job) -> Path:
    """Where a finished run's record lives: beside its log."""
    return job.log.with_name(job.log.name + ".run.json")


def write_record(job: Job) -> None:
    record = {"argv": job.argv, "returncode": job.returncode, "seconds": job.seconds,
              "error": job.error, "finished": datetime.now().isoformat(timespec="seconds")}
    atomic_write_text(record_path(job), json.dumps(record) + "\n")


def _judge_record(job: Job) -> tuple[dict | None, str | None]:
    """(the record that keeps this run, else None; why an existing record does not keep it,
    else None). A run that failed, ran with another command or lost its folder runs again;
    one with no record never finished."""
    try:
        record = json.loads(record_path(job).read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:
        return None, f"its record {record_path(job)} is unreadable ({exc})"
    if not isinstance(record, dict) or "argv" not in record:
        return None, f"its record {record_path(job)} is not one this version writes"
    if record["argv"] != job.argv:
        changed = [a for a in job.argv if a not in record["argv"]]
        return None, ("it ran with another command"
                      + (f" (now {shlex.join(changed[:4])})" if changed else ""))
    if record.get("returncode") != 0 or record.get("error") is not None:
        return None, ("it failed ("
                      + (record.get("error") or f"exit code {record.get('returncode')}") + ")")
    if not job.folder.is_dir():
        return None, f"its folder {job.folder} is gone"
    return record, None


def why_not_kept(job: Job) -> str | None:
    """Why an earlier invocation's record of this run does not keep it (None: it does, or
    there is no record)."""
    return _judge_record(job)[1]


def kept_record(job: Job) -> dict | None:
    """The record of this very run (the same command) that ended well, else None."""
    return _judge_record(job)[0]


def keep_if_finished(job: Job) -> bool:
    """Under ``--resume`` (``job.resume``): keep the run if an earlier invocation finished it
    well (``kept_record``), taking its exit code and seconds; -> whether it was kept."""
    if not job.kept and job.resume and (record := kept_record(job)) is not None:
        job.returncode, job.seconds = 0, float(record["seconds"])
        job.kept = str(record.get("finished") or "an earlier invocation")
    return job.kept is not None


def resume_note(jobs) -> str | None:
    """What a resumed benchmark's report says about its runs: how many were kept from the
    earlier invocation(s) and when they had finished (None if none was kept)."""
    kept = sorted(j.kept for j in jobs if j.kept)
    if not kept:
        return None
    return (f"resumed (--resume): {len(kept)} of {len(jobs)} runs were kept from the earlier "
            f"invocation(s), finished {kept[0]} to {kept[-1]}; the other {len(jobs) - len(kept)} "
            f"ran in this one, which ended {datetime.now().isoformat(timespec='seconds')}")


def run_job(job: Job, progress: Progress, timeout: float | None = None) -> None:
    """Run one mode to its end (or timeout); sets returncode, seconds and error. Under
    ``--resume`` (``job.resume``) a run whose record says it ended well is kept instead
    (``job.kept``).

    ``timeout`` defaults to twice the run's budget plus 300 s (start-up, evaluation catch-up).
    """
    if keep_if_finished(job):
        return
    timeout = timeout if timeout is not None else 2 * job.budget + 300
    job.log.parent.mkdir(parents=True, exist_ok=True)
    record_path(job).unlink(missing_ok=True)
    if job.folder.exists():
        # Only with --overwrite, or --resume running again a run that did not end well
        # (checked in parse_args): replace it entirely, so that no earlier record (e.g. an
        # evaluations.jsonl line) can mix into the new one.
        shutil.rmtree(job.folder)
    start = time.monotonic()
    with open(job.log, "wb") as out:
        out.write(f"$ {shlex.join(job.prefix + job.argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(job.prefix + job.argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(REPO), env=child_env(job),
                                start_new_session=True, preexec_fn=die_with_parent)
    try:
        while proc.poll() is None:
            elapsed = time.monotonic() - start
            if elapsed > timeout:
                stop(proc)
                job.error = f"no end after {timeout:.0f}s; stopped"
                break
            progress.tick(job, elapsed)
            time.sleep(0.5)
    except BaseException:
        stop(proc, grace=15)
        raise
    job.seconds = time.monotonic() - start
    job.returncode = proc.returncode
    if job.error is None and proc.returncode != 0:
        code = proc.returncode
        job.error = (f"exit code {code}" if code >= 0
                     else f"killed by signal {signal.Signals(-code).name}")
    write_record(job)
