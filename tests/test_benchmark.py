"""esync-benchmark: one real short run of every kind of mode, the report checked against the logs.

The end-to-end run is a real local cluster (scheduler, server, state server, evaluator, two
workers slowed x1 and x2) for esync (both state-server policies) and sync, plus a standalone
``main.py -m local`` run, each with an 8 s training budget, on small generated IDX files.
No wall-clock time is asserted: the report's numbers are compared with the summaries.
"""
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import write_fashion_dir
from esync import benchmark

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "benchmark.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ROWS = ("esync", "esync-planned", "sync", "local")
SLOWDOWNS = (1.0, 2.0)


def run_script(*args, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=str(REPO),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    # Learnable stand-in for Fashion-MNIST (one bright bar per class): accuracy rises in seconds.
    return write_fashion_dir(tmp_path_factory.mktemp("bench") / "data", train_per_class=100,
                             test_per_class=30)


@pytest.fixture(scope="module")
def bench(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out") / "report"
    proc = run_script("--workers", 2, "--slowdown", "1,2", "--budget", 8,
                      "--modes", "esync,sync,local", "--policy", "both", "--target", 0.5,
                      "-dd", data_dir, "--out", out)
    return proc, out


def results_row(report: str, name: str) -> list[str]:
    """The cells of the results table's row for mode `name` (the first table naming it)."""
    for line in report.splitlines():
        if line.startswith("| ") and f"(`{name}`)" in line and "Time to" not in line:
            return [cell.strip() for cell in line.strip().strip("|").split("|")]
    raise AssertionError(f"no row for {name} in report.md")


def summary_of(out: Path, name: str) -> dict:
    root = out / ("rep1-planned" if name == "esync-planned" else "rep1") / "lenet"
    folder = "esync" if name == "esync-planned" else name
    file = {"esync": "ESync.json", "sync": "Sync.json", "local": "Local.json"}[folder]
    return json.loads((root / folder / file).read_text())


def throughput_from_devices(summary: dict) -> float:
    """Cluster samples/s recomputed from the per-device lists (not the summary's totals)."""
    devices = [e for host, by_dev in summary.items() if not host.startswith("_")
               for e in by_dev.values()]
    samples = sum(sum(e["num_samples_list"]) for e in devices)
    wall = max(e["elapsed_time_list"][-1] for e in devices)
    return samples / wall


def time_to(summary: dict, target: float):
    ev = summary["_evaluator"]
    hits = sorted(t for t, a in zip(ev["elapsed_time_list"], ev["accuracy_list"]) if a >= target)
    return hits[0] if hits else None


# ----------------------------------------------------------------------------- end to end

def test_runs_every_mode_and_exits_zero(bench):
    proc, out = bench
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for i, name in enumerate(ROWS, start=1):       # progress: which run, then its end
        assert f"[{i}/4] rep 1 {name}: started" in proc.stderr
        assert re.search(rf"\[{i}/4\] rep 1 {name}: done after \d+s", proc.stderr)
    assert f"report written to {out / 'report.md'}" in proc.stdout
    runs = json.loads((out / "benchmark.json").read_text())["runs"]
    assert [(r["name"], r["ok"]) for r in runs] == [(name, True) for name in ROWS]


def test_report_names_every_mode_and_the_setup(bench):
    _, out = bench
    report = (out / "report.md").read_text()
    for name in ROWS:
        assert f"(`{name}`)" in report
    assert "2 workers" in report and "×1, ×2" in report
    assert "one run on this machine" in report and "ratios" in report
    assert "esync-benchmark --workers 2 --slowdown 1,2 --budget 8" in report   # as typed
    assert "python -m esync.launch -m sync --workers 2 --slowdown 1,2" in report
    assert "--max-seconds 8.0" in report
    assert "## Failures" not in report


def test_planned_policy_ran_into_its_own_log_root(bench):
    _, out = bench
    dynamic = json.loads((out / "rep1" / "lenet" / "esync" / "run.json").read_text())
    planned = json.loads((out / "rep1-planned" / "lenet" / "esync" / "run.json").read_text())
    assert (dynamic["policy"], planned["policy"]) == ("dynamic", "planned")
    assert not (out / "rep1-planned" / "lenet" / "sync").exists()


def test_figures_are_real_pngs(bench):
    _, out = bench
    for stem in ("accuracy-iid", "data-throughput", "traffic-load", "computing-time-ratio",
                 "esync-policies"):
        png = out / "figures" / f"lenet-{stem}.png"
        assert png.stat().st_size > 1000, png
        assert png.read_bytes()[:8] == PNG_SIGNATURE
        assert f"](figures/lenet-{stem}.png)" in (out / "report.md").read_text()


def test_table_csv_has_one_row_per_mode(bench):
    _, out = bench
    with open(out / "speedup.csv", newline="") as fp:
        rows = list(csv.DictReader(fp))
    assert sorted(r["mode"] for r in rows) == sorted(ROWS)
    assert all(r["runs"] == "1" for r in rows)


def test_report_numbers_agree_with_the_summaries(bench):
    _, out = bench
    report = (out / "report.md").read_text()
    summaries = {name: summary_of(out, name) for name in ROWS}
    local_tp = throughput_from_devices(summaries["local"])
    limit = sum(local_tp / f for f in SLOWDOWNS)
    assert f"= **{limit:.1f} samples/s**" in report
    sync_time = time_to(summaries["sync"], 0.5)
    for name in ROWS:
        cells = results_row(report, name)
        s = summaries[name]
        tp = throughput_from_devices(s)
        assert cells[5] == f"{tp:.1f}", name
        expected_fraction = tp / (local_tp if name == "local" else limit)
        assert cells[6].split()[0] == f"{expected_fraction:.2f}", name
        assert cells[3] == f"{s['_evaluator']['accuracy_list'][-1]:.3f}", name
        assert cells[4] == f"{summaries['local']['_evaluator']['accuracy_list'][-1]:.3f}"
        reached = time_to(s, 0.5)
        if reached is None:
            assert cells[1] == "not reached"
        else:
            assert cells[1] == f"{reached:.1f}", name
            if sync_time is not None:
                assert cells[2] == f"{sync_time / reached:.2f}×", name
        pushed = sum(sum(e["bytes_pushed_list"]) + sum(e["bytes_pulled_list"])
                     for host, d in s.items() if not host.startswith("_") for e in d.values())
        assert cells[7] == f"{pushed / s['_totals']['wall_time'] / 1e6:.2f}", name
    # Traffic is counted: the cluster modes moved bytes, standalone training none.
    assert float(results_row(report, "sync")[7]) > 0
    assert results_row(report, "local")[7] == "0.00"
    # ESync asks the state server; planned asks about once per worker and round.
    requests = {n: float(results_row(report, n)[8]) for n in ("esync", "esync-planned", "sync")}
    assert requests["sync"] == 0 and requests["esync"] > 0 and requests["esync-planned"] > 0


def test_computing_time_ratio_per_device(bench):
    _, out = bench
    report = (out / "report.md").read_text()
    section = report.split("### Computing-time ratio per device")[1].split("###")[0]
    assert "cpu0 (×1)" in section and "cpu1 (×2)" in section
    s = summary_of(out, "sync")
    host = next(h for h in s if not h.startswith("_"))
    ratio = s[host]["cpu1"]["computing_time_ratio"]
    row = next(line for line in section.splitlines() if "(`sync`)" in line)
    assert f"| {ratio:.2f} |" in row


def test_existing_report_folder_is_not_reused(bench, data_dir):
    _, out = bench
    proc = run_script("--workers", 2, "--slowdown", "1,2", "--modes", "local", "-dd", data_dir,
                      "--out", out, timeout=120)
    assert proc.returncode == 2
    assert "already holds files" in proc.stderr and "--overwrite" in proc.stderr


# ----------------------------------------------------------------------------- failures

def test_a_failing_mode_is_reported_and_the_others_still_run(data_dir, tmp_path):
    out = tmp_path / "out"
    # A job timeout shorter than start-up: each run is stopped and reported as failed.
    proc = run_script("--workers", 2, "--slowdown", "1,2", "--budget", 8, "--modes",
                      "sync,local", "--job-timeout", 2, "-dd", data_dir, "--out", out,
                      timeout=180)
    assert proc.returncode == 1
    assert "rep 1 sync failed" in proc.stderr and "rep 1 local failed" in proc.stderr
    report = (out / "report.md").read_text()
    failures = report.split("## Failures")[1]
    assert "rep 1 `sync`: no end after 2s; stopped" in failures
    assert "rep 1 `local`: no end after 2s; stopped" in failures
    assert "esync.launch -m sync" in failures          # the tail of the launcher's output
    assert "Physical limit: n/a" in report


# ----------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("argv, message", [
    (["--modes", "esync,bogus"], "argument --modes: 'bogus' is not a mode"),
    (["--modes", ","], "argument --modes: give at least one"),
    (["--slowdown", "1,2"], "argument --slowdown: 2 factors for 4 workers"),
    (["--slowdown", "1,1,x,8"], "argument --slowdown: '1,1,x,8' is not a comma-separated list"),
    (["--workers", "2", "--slowdown", "1,0.5"], "argument --slowdown: factors must be numbers"),
    (["--budget", "0"], "argument --budget: must be a positive number"),
    (["--policy", "fast"], "argument --policy: invalid choice"),
    (["--target", "1.5"], "argument --target: must be a number in (0, 1]"),
    (["-n", "vgg"], "argument -n/--network: 'vgg' is not a network"),
    (["-dd", "/nonexistent-esync"], "lacks train-images-idx3-ubyte.gz"),
])
def test_bad_arguments_exit_2_with_one_clear_line(argv, message, capsys):
    assert benchmark.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("esync-benchmark: error: ") and message in err, err
    assert err.count("\n") == 1


def test_bad_arguments_from_the_command_line():
    proc = run_script("--modes", "esync,foo", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("esync-benchmark: error: argument --modes: 'foo' is not a "
                                   "mode; choose from esync, sync, async, dcasgd, local "
                                   "(comma-separated)")
    proc = run_script("--workers", 3, "--slowdown", "1,4", timeout=120)
    assert proc.returncode == 2
    assert "argument --slowdown: 2 factors for 3 workers" in proc.stderr
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- planning

def test_plan_repeats_niid_and_policies(data_dir, tmp_path):
    args = benchmark.parse_args(["--modes", "esync,async,dcasgd,local", "--niid", "--repeats",
                                 "2", "-dd", str(data_dir), "--out", str(tmp_path / "o")])
    jobs = benchmark.plan(args, tmp_path / "o")
    rep1 = [(j.name, j.root.name, j.folder.name) for j in jobs if j.rep == 1]
    assert rep1 == [
        ("esync", "rep1", "esync"), ("esync-planned", "rep1-planned", "esync"),
        ("async", "rep1", "async"), ("dcasgd", "rep1", "dcasgd"), ("local", "rep1", "local"),
        ("esync-niid", "rep1", "esync-niid"),
        ("esync-planned-niid", "rep1-planned", "esync-niid"),
        ("async-niid", "rep1", "async-niid"), ("dcasgd-niid", "rep1", "dcasgd-niid")]
    assert [j.root.name for j in jobs if j.rep == 2][:2] == ["rep2", "rep2-planned"]
    dcasgd = next(j for j in jobs if j.name == "dcasgd-niid")
    assert dcasgd.argv[1:7] == ["-m", "esync.launch", "-m", "async", "-dcasgd", "1"]
    assert dcasgd.argv[dcasgd.argv.index("-s") + 1] == "1"
    assert "--max-seconds" in dcasgd.argv and "--quiet" in dcasgd.argv
    local = next(j for j in jobs if j.name == "local")
    assert local.argv[1].endswith("main.py") and "-e" in local.argv
    assert benchmark.child_env("local")["OMP_NUM_THREADS"] == "1"
    only = benchmark.plan(benchmark.parse_args(
        ["--modes", "esync", "--policy", "planned", "-dd", str(data_dir), "--out",
         str(tmp_path / "p")]), tmp_path / "p")
    assert [(j.name, j.root.name, j.policy) for j in only] == [("esync", "rep1", "planned")]


def test_cells_give_mean_and_std_over_repeats():
    assert benchmark._cell([2.0, 4.0, None], ".1f") == "3.0 ± 1.4"
    assert benchmark._cell([2.0], ".2f") == "2.00"
    assert benchmark._cell([None], ".2f") == "n/a"
