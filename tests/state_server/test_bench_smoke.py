"""Smoke test of scripts/bench_state_server.py: each protocol runs against a real server and
writes the figures the README quotes (small numbers; performance is never asserted here)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"critical_path_ms_p50", "critical_path_ms_p99", "requests_per_round", "errors",
        "endpoints"}


@pytest.mark.parametrize("policy, protocol, extra, endpoints", [
    ("planned", "rounds", (), {"rounds"}), ("planned", "legacy", (), {"plan", "reset"}),
    ("dynamic", "apply", (), {"apply"}), ("dynamic", "apply", ("--no-lease",), {"apply", "reset"})])
def test_bench_runs_the_protocol_and_reports_its_figures(tmp_path, policy, protocol, extra,
                                                         endpoints):
    out = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_state_server.py"),
                           "--workers", "4", "--rounds", "5", "--policy", policy,
                           "--protocol", protocol, "--iteration-ms", "1,2", *extra,
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    report = json.loads(out.read_text()) if out.exists() else {}
    assert (done.returncode, KEYS <= set(report), set(report.get("endpoints", ())),
            report.get("errors")) == (0, True, endpoints, 0), done.stdout + done.stderr


def test_bench_refuses_a_protocol_of_the_other_policy(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_state_server.py"),
                           "--policy", "dynamic", "--protocol", "rounds", "--out",
                           str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a protocol of the dynamic policy" in done.stderr
