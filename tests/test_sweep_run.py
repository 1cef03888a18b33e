"""The heterogeneity sweep end to end: a short real sweep (ESync's two rows at gaps 1 and 64,
the sleep emulation, so no root is needed) writes its report, its JSON and its figure, and the
advisor's table reads its runs. Nothing about speed is asserted."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import write_fashion_dir

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.5


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep-run")
    # learnable stand-in for Fashion-MNIST (one bright bar per class): accuracy rises in seconds
    data = write_fashion_dir(root / "data", train_per_class=100, test_per_class=30)
    out = root / "report"
    proc = sweep(out, data)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def sweep(out: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "esync.benchmark", "--gap-sweep", "1,64", "--modes", "esync",
         "--tune-lr", "none", "-ll", "0.001", "--repeats", "1", "--budget", "8",
         "--target", str(TARGET), "--emulation", "sleep", "-dd", str(data), "--out", str(out),
         *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600)


def test_the_report_has_a_column_per_gap_and_esyncs_two_rows(swept):
    report = (swept / "report.md").read_text()
    assert f"| row (time to {TARGET:g}, s) | 1:1 | 64:1 |" in report
    rows = [line.split(" | ")[0].lstrip("| ") for line in report.splitlines()
            if line.startswith("| ESync")]
    assert rows[:2] == ["ESync (the launcher's defaults)", "ESync, the fast devices alone"]
    assert "figures/sweep-time-to-target.png" in report
    assert (swept / "figures" / "sweep-time-to-target.png").stat().st_size > 0


def test_the_json_holds_each_gaps_rows(swept):
    gaps = json.loads((swept / "benchmark.json").read_text())["gaps"]
    assert sorted(gaps) == ["gap1", "gap64"]
    assert gaps["gap64"]["slowdown"] == "1,1,64,64"
    assert {"esync", "esync-fast"} <= set(gaps["gap64"]["rows"])


def test_the_advisor_table_predicts_from_each_gaps_esync_run(swept):
    report = (swept / "report.md").read_text()
    section = report.split("## The advisor against the sweep", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| 1:1") or line.startswith("| 64:1")]
    assert [r[0] for r in rows] == ["1:1", "64:1"]
    for row in rows:
        float(row[1])              # a prediction, not the reason there is none
    assert rows[1][4] != "-"       # at 64:1 the fast devices alone are a subset


def test_a_resumed_sweep_keeps_its_finished_runs_and_writes_the_same_table(swept):
    """Last in the file: it rewrites the report the tests above read."""
    before = (swept / "report.md").read_text()
    proc = sweep(swept, swept.parent / "data", "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done after" not in proc.stderr
    report = (swept / "report.md").read_text()
    runs = proc.stderr.count("kept from the earlier invocation")
    assert runs == 3                # ESync at gap 1, at 64, and on the fast devices alone
    assert f"Resumed (--resume): {runs} of {runs} runs were kept" in report
    table = before.split("## Time to", 1)[1].split("\n## ", 1)[0]
    assert table in report
