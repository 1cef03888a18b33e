"""esync-benchmark --resume: an interrupted benchmark continues in its --out folder, keeping the
runs that had finished (the record beside each run's log) and running the others; other
options, a folder it cannot continue and --overwrite beside it are refused with what to do.
Real standalone runs on a learnable stand-in for the data; no time is asserted."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import write_fashion_dir
from esync import benchmark
from esync.benchmark import options, plan, runs

REPO = Path(__file__).resolve().parents[1]
# two repeats of standalone SGD alone: the smallest benchmark with two runs to keep or redo
FLAGS = ("--modes", "local", "--tune-lr", "none", "--no-niid", "--net", "loopback",
         "--repeats", "2", "--budget", "2", "--scenarios", "static", "--target", "0.5",
         "--tune-momentum", "0", "--fast-devices", "none", "--horovod", "off")


def bench(out: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "esync.benchmark", *FLAGS, "-dd", str(data),
                           "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def run_folder(out: Path, rep: int) -> Path:
    """The folder a repeat's standalone run writes (deleted before that run runs again)."""
    return out / "loopback" / f"rep{rep}" / "local" / "lenet" / "local"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_fashion_dir(tmp_path_factory.mktemp("resume") / "data", train_per_class=100,
                             test_per_class=30)


@pytest.fixture(scope="module")
def interrupted(data, tmp_path_factory):
    """A finished benchmark made to look as if it had been stopped during its second run:
    that run's record is gone. A file left in each run's folder shows which ran again."""
    out = tmp_path_factory.mktemp("resume-out") / "report"
    first = bench(out, data)
    assert first.returncode == 0, first.stderr[-3000:]
    for rep in (1, 2):
        (run_folder(out, rep) / "left-here").write_text("")
    (out / "runs" / "loopback-rep2-local.log.run.json").unlink()
    (out / "report.md").unlink()
    again = bench(out, data, "--resume")
    return out, again


def test_resume_keeps_the_finished_run_and_runs_the_other(interrupted):
    out, proc = interrupted
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rep 1 loopback local: kept from the earlier invocation (--resume)" in proc.stderr
    assert "rep 1 loopback local: started" not in proc.stderr
    assert "rep 2 loopback local: done after" in proc.stderr
    assert (run_folder(out, 1) / "left-here").exists()
    assert not (run_folder(out, 2) / "left-here").exists()
    assert (run_folder(out, 2) / "run.json").exists()


def test_the_resumed_report_counts_both_runs_and_says_which_was_kept(interrupted):
    out, _ = interrupted
    data = json.loads((out / "benchmark.json").read_text())
    assert data["kept_runs"] == 1
    assert sorted(r["rep"] for r in data["runs"]) == [1, 2]
    assert "resumed (--resume): 1 of 2 runs were kept" in (out / "report.md").read_text()


def test_a_resumed_benchmark_records_the_run_it_ran(interrupted):
    out, _ = interrupted
    record = json.loads((out / "runs" / "loopback-rep2-local.log.run.json").read_text())
    assert record["returncode"] == 0 and record["error"] is None
    assert "--max-train-seconds" in record["argv"]


def test_resume_with_other_options_is_refused_and_changes_nothing(interrupted, data):
    out, _ = interrupted
    before = (out / "report.md").read_text()
    proc = bench(out, data, "--resume", "--seed", "5")
    assert proc.returncode == 2
    assert "was started as" in proc.stderr and "give the same options" in proc.stderr
    assert (out / "report.md").read_text() == before


def args_for(data: Path, out: Path, *extra: str):
    return benchmark.parse_args([*FLAGS, "-dd", str(data), "--out", str(out), *extra])


@pytest.mark.parametrize("extra, message", [
    (("--resume", "--overwrite"), "exclude each other"),
    (("--resume",), "holds no benchmark this version can continue"),
])
def test_resume_refuses_what_it_cannot_continue(data, tmp_path, extra, message):
    with pytest.raises(options.UsageError, match=message):
        args_for(data, tmp_path / "never-started", *extra)


def test_resume_needs_the_folder_to_continue(data):
    with pytest.raises(options.UsageError, match="--resume needs --out"):
        benchmark.parse_args([*FLAGS, "-dd", str(data), "--resume"])


def one_job(data: Path, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    (out / options.INVOCATION_FILE).write_text(json.dumps(
        {"argv": [*FLAGS, "-dd", str(data), "--out", str(out)], "started": "2026-01-01T00:00"}))
    args = args_for(data, out, "--resume")
    rows = plan.rows(args)
    job = plan.full_jobs(args, out, rows, plan.settings(args, None),
                         {r.group: 0.01 for r in rows})[0]
    job.folder.mkdir(parents=True)
    job.log.parent.mkdir(parents=True, exist_ok=True)
    return job


@pytest.mark.parametrize("change, why", [
    ({}, None),
    ({"returncode": 1, "error": "exit code 1"}, "it failed (exit code 1)"),
    ({"argv": ["another", "command"]}, "it ran with another command"),
])
def test_only_a_record_of_the_same_command_that_ended_well_is_kept(data, tmp_path, change,
                                                                   why):
    job = one_job(data, tmp_path / "o")
    job.returncode, job.seconds = 0, 3.0
    runs.write_record(job)
    record = json.loads(runs.record_path(job).read_text())
    runs.record_path(job).write_text(json.dumps({**record, **change}))
    assert runs.keep_if_finished(job) is (why is None)
    assert why is None or (runs.why_not_kept(job) or "").startswith(why)
    assert job.kept is None or (job.seconds == 3.0 and job.returncode == 0)


def test_a_run_whose_folder_is_gone_is_not_kept(data, tmp_path):
    job = one_job(data, tmp_path / "o")
    job.returncode = 0
    runs.write_record(job)
    job.folder.rmdir()
    assert not runs.keep_if_finished(job)
    assert "is gone" in runs.why_not_kept(job)


def test_without_resume_a_finished_record_is_not_kept(data, tmp_path):
    job = one_job(data, tmp_path / "o")
    job.returncode = 0
    runs.write_record(job)
    job.resume = False
    assert not runs.keep_if_finished(job)
