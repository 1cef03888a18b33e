"""esync-benchmark: options, the plan of runs (repeats, seeds, scenarios, emulation, the time
estimate), tuning, the statistics over repeats (median, min–max, overlaps, Table 1) on hand-made
numbers, the report on synthetic logs, and short real runs (a local cluster for esync and sync
plus standalone SGD; a tuning grid on standalone SGD) whose report is checked against the logs.
No wall-clock time is asserted."""
import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from support import write_fashion_dir
from esync import benchmark
from esync.analysis import summary as summary_mod
from esync.benchmark import metrics, options, pace, plan, report, runs, stats
from esync.emulation import shaping
from esync.emulation import standalone_cap as emulation
from esync.common import runlayout

sys.path.insert(0, str(Path(__file__).resolve().parent / "analysis"))
import logmaker  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "benchmark.py"
ROWS = ("esync-mean", "sync", "local")
SLOWDOWNS = (1.0, 2.0)
FLAGS = {"--aggregation", "--outer-momentum", "--nesterov", "--net", "--bandwidth",
         "--server-bandwidth", "--hosts", "--emulation", "--cpu-share", "--speed-schedule",
         "--collective", "--no-cpu-pinning"}
OLD_FLAGS = FLAGS - {"--emulation", "--cpu-share", "--speed-schedule", "--collective",
                     "--no-cpu-pinning"}


# The benchmark as these tests describe it: rates alone (no momentum axis), no fast-devices or
# Horovod rows; tests/test_benchmark_fair.py covers those, and the default's estimate below.
RATES_ONLY = ("--tune-momentum", "0", "--fast-devices", "none", "--horovod", "off")


def run_script(*args, timeout=900):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args), *RATES_ONLY],
                          cwd=str(REPO), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    # Learnable stand-in for Fashion-MNIST (one bright bar per class): accuracy rises in seconds.
    return write_fashion_dir(tmp_path_factory.mktemp("bench") / "data", train_per_class=100,
                             test_per_class=30)


@pytest.fixture
def full_launcher(monkeypatch):
    """A launcher with the aggregation, namespace, emulation and speed-schedule options, and
    namespaces possible."""
    monkeypatch.setattr(options, "launcher_flags", lambda: FLAGS)
    monkeypatch.setattr(options, "netns_possible", lambda flags: None)


@pytest.fixture
def old_launcher(monkeypatch):
    """A launcher from before CPU caps: no --emulation, no --speed-schedule."""
    monkeypatch.setattr(options, "launcher_flags", lambda: OLD_FLAGS)
    monkeypatch.setattr(options, "netns_possible", lambda flags: None)


def args_for(data_dir, tmp_path, *extra):
    return benchmark.parse_args(["-dd", str(data_dir), "--out", str(tmp_path / "o"),
                                 *RATES_ONLY, *extra])


# ----------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def bench(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out") / "report"
    # One repeat of the static scenario, SSGD within the budget: the file's time stays where it
    # was; repeats, scenarios and Table 1 are checked on the plan and on hand-made numbers.
    proc = run_script("--workers", 2, "--slowdown", "1,2", "--budget", 8,
                      "--modes", "esync,sync,local", "--aggregations", "mean", "--target", 0.5,
                      "--tune-lr", "none", "--no-niid", "--net", "loopback", "--repeats", 1,
                      "--scenarios", "static", "--sync-cap-seconds", 8,
                      "-dd", data_dir, "--out", out)
    return proc, out


def results_row(report_text: str, setting: str, name: str) -> list[str]:
    """The cells of the row for `name` in the setting's detailed results table."""
    section = report_text.split(f"## Results: {setting}")[1].split("\n## ")[0]
    for line in section.splitlines():
        if line.startswith("| ") and f"(`{name}`)" in line:
            return [cell.strip() for cell in line.strip().strip("|").split("|")]
    raise AssertionError(f"no row for {name} in the {setting} results")


def summary_of(out: Path, name: str) -> dict:
    folder = {"esync-mean": "esync"}.get(name, name)
    mode_dir = out / "loopback" / "rep1" / name / "lenet" / folder
    return json.loads((mode_dir / summary_mod.summary_name(folder)).read_text())


def throughput_from_devices(summary: dict) -> float:
    """Cluster samples/s recomputed from the per-device lists (not the summary's totals)."""
    devices = [e for host, by_dev in summary.items() if not host.startswith("_")
               for e in by_dev.values()]
    return (sum(sum(e["num_samples_list"]) for e in devices)
            / max(e["elapsed_time_list"][-1] for e in devices))


def time_to(summary: dict, target: float):
    """When the evaluator's curve crossed ``target``, linearly between the checkpoints around
    the crossing (the report's rule)."""
    ev = summary["_evaluator"]
    pairs = sorted(zip(ev["elapsed_time_list"], ev["accuracy_list"]))
    for i, (t, a) in enumerate(pairs):
        if a >= target:
            if i == 0:
                return t
            t0, a0 = pairs[i - 1]
            return t0 + (t - t0) * (target - a0) / (a - a0)
    return None


def test_runs_every_row_and_exits_zero(bench):
    proc, out = bench
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads((out / "benchmark.json").read_text())["runs"]
    assert [(r["name"], r["ok"]) for r in runs] == [(name, True) for name in ROWS]


def test_progress_names_each_run_then_its_end(bench):
    proc, _ = bench
    for i, name in enumerate(ROWS, start=1):
        assert re.search(rf"\[{i}/3\] rep 1 loopback {name}: done after \d+s", proc.stderr), name


def test_report_names_the_setup_and_the_commands(bench):
    report_text = (bench[1] / "report.md").read_text()
    assert "2 workers" in report_text and "×1, ×2" in report_text
    assert "esync-benchmark --workers 2 --slowdown 1,2 --budget 8" in report_text   # as typed
    assert "python -m esync.launch -m sync --workers 2 --slowdown 1,2" in report_text
    assert "## Failures" not in report_text


def test_report_numbers_agree_with_the_summaries(bench):
    out = bench[1]
    text = (out / "report.md").read_text()
    summaries = {name: summary_of(out, name) for name in ROWS}
    local_tp = throughput_from_devices(summaries["local"])
    # A capped standalone run (one x1 device: `share` of a core) gets tp / share per core.
    share = json.loads((out / "benchmark.json").read_text())["emulation"]["standalone"]["share"]
    limit = min(sum(local_tp / f for f in SLOWDOWNS), 2 * local_tp / (share or 1))  # 2 cores
    assert f"= **{limit:.1f} samples/s**" in text
    for name in ROWS:
        cells, s = results_row(text, "loopback", name), summaries[name]
        tp = throughput_from_devices(s)
        assert cells[6] == f"{tp:.1f}", name
        assert cells[7].split()[0] == f"{tp / (local_tp if name == 'local' else limit):.2f}"
        assert cells[4] == f"{s['_evaluator']['accuracy_list'][-1]:.3f}", name
        reached = time_to(s, 0.5)
        assert cells[1] == ("not reached" if reached is None else f"{reached:.1f}"), name


def test_traffic_is_counted_for_cluster_modes_only(bench):
    text = (bench[1] / "report.md").read_text()
    assert float(results_row(text, "loopback", "sync")[8]) > 0
    assert results_row(text, "loopback", "local")[8] == "0.00"


def test_only_esync_asks_the_state_server(bench):
    text = (bench[1] / "report.md").read_text()
    requests = {n: float(results_row(text, "loopback", n)[9]) for n in ("esync-mean", "sync")}
    assert requests["sync"] == 0 < requests["esync-mean"]


def test_results_csv_has_one_row_per_row_name(bench):
    with open(bench[1] / "tables" / "results.csv", newline="") as fp:
        rows = {r["row"]: r for r in csv.DictReader(fp)}
    assert sorted(rows) == sorted(ROWS) and rows["esync-mean"]["label"] == "ESync (mean)"
    assert {r["setting"] for r in rows.values()} == {"loopback"}


def test_report_says_which_emulation_ran(bench):
    """This checkout's launcher writes no cluster.json unless it has caps: the report says
    what the runs' cluster.json files say, or that the launcher predates them."""
    out = bench[1]
    text = (out / "report.md").read_text()
    folders = [out / "loopback" / "rep1" / n / "lenet" / {"esync-mean": "esync"}.get(n, n)
               for n in ("esync-mean", "sync")]
    kinds = {(emulation.read_cluster(f) or {}).get("emulation") or emulation.OLDER
             for f in folders}
    assert len(kinds) == 1
    assert f"- emulation: **{kinds.pop()}** in every cluster run" in text


def test_accuracy_figure_is_linked_from_the_report(bench):
    text = (bench[1] / "report.md").read_text()
    svg = (bench[1] / "figures" / "lenet-loopback-accuracy-iid.svg").read_text()
    assert "](figures/lenet-loopback-accuracy-iid.png)" in text and ">ESync (mean)<" in svg


def test_existing_report_folder_is_not_reused(bench, data_dir):
    proc = run_script("--workers", 2, "--slowdown", "1,2", "--modes", "local", "-dd", data_dir,
                      "--net", "loopback", "--out", bench[1], timeout=300)
    assert proc.returncode == 2
    assert "already holds files" in proc.stderr and "--overwrite" in proc.stderr


def test_tuning_runs_the_grid_then_the_full_run_with_the_best_value(data_dir, tmp_path):
    out = tmp_path / "tuned"
    proc = run_script("--modes", "local", "--tune-lr", "0.0001,0.02", "--tune-budget", 3,
                      "--budget", 3, "--net", "loopback", "--target", 0.5, "--repeats", 1,
                      "-dd", data_dir, "--out", out, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "benchmark.json").read_text())
    scores = data["tuning"]["local"]["scores"]
    best = max(scores, key=lambda lr: scores[lr])
    full = [r for r in data["runs"] if r["rep"] == 1]
    # Whichever end won, the grid grew a step (x200) beyond it, and that value lost.
    tried = sorted(float(lr) for lr in scores)
    assert tried in ([0.0001, 0.02, 4.0], [5e-07, 0.0001, 0.02]), scores
    assert float(best) not in (tried[0], tried[-1])
    assert [r["lr"] for r in full] == [float(best)]
    # then the two best rates again with the next two seeds (one device alone): 3 + 4 tuning
    # runs, 1 full run
    again = [r for r in data["runs"] if r["rep"] == 0 and r["seed"] in (2, 3)]
    assert len(again) == 4 and len(data["runs"]) == 8
    assert float(best) in [r["lr"] for r in again if r["seed"] == 3]
    assert data["tuning"]["local"]["seeds"][best] == 3


def test_a_failing_run_is_reported_and_the_others_still_run(data_dir, tmp_path):
    out = tmp_path / "out"
    # A job timeout shorter than start-up: each run is stopped and reported as failed.
    proc = run_script("--workers", 2, "--slowdown", "1,2", "--budget", 8, "--modes",
                      "sync,local", "--job-timeout", 2, "--tune-lr", "none", "--no-niid",
                      "--net", "loopback", "--repeats", 1, "--scenarios", "static",
                      "-dd", data_dir, "--out", out,
                      timeout=300)
    assert proc.returncode == 1
    assert "rep 1 loopback sync failed" in proc.stderr
    failures = (out / "report.md").read_text().split("## Failures")[1]
    assert "rep 1 loopback local: no end after 2s; stopped" in failures
    assert "esync.launch -m sync" in failures          # the tail of the launcher's output


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
    (["--tune-lr", "0.01,x"], "argument --tune-lr: '0.01,x' is not a comma-separated list"),
    (["--tune-lr", "0.01,-1"], "argument --tune-lr: learning rates must be positive"),
    (["--byclass-tune-lr", "0.01,x"],
     "argument --byclass-tune-lr: '0.01,x' is not a comma-separated list"),
    (["--byclass-tune-lr", "none"],
     "argument --byclass-tune-lr: give learning rates, 'auto' or 'same'"),
    (["--aggregations", "median"], "argument --aggregations: 'median' in 'median' is not a rule"),
    (["--aggregations", "mean+nesterov=x"], "'nesterov=x' in 'mean+nesterov=x' is not"),
    (["--bandwidth", "fast"], "argument --bandwidth: 'fast' is not 'auto' or tc rates"),
    (["--net", "wifi"], "argument --net: invalid choice"),
])
def test_bad_arguments_exit_2_with_one_clear_line(argv, message, capsys, full_launcher):
    assert benchmark.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("esync-benchmark: error: ") and message in err, err
    assert err.count("\n") == 1


def test_bad_arguments_from_the_command_line():
    proc = run_script("--modes", "esync,foo", timeout=300)
    assert (proc.returncode, proc.stderr.strip()) == (2, (
        "esync-benchmark: error: argument --modes: 'foo' is not a mode; choose from esync, "
        "sync, async, dcasgd, dcasgd-mxnet, local (comma-separated)"))


def test_netns_asked_for_where_impossible_names_why(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(options, "launcher_flags", lambda: FLAGS)
    monkeypatch.setattr(options, "netns_possible", lambda flags: "network namespaces need root")
    with pytest.raises(options.UsageError, match="--net netns: network namespaces need root"):
        args_for(data_dir, tmp_path, "--net", "netns")


def test_default_falls_back_to_loopback_with_a_notice(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(options, "launcher_flags", lambda: FLAGS)
    monkeypatch.setattr(options, "netns_possible", lambda flags: "network namespaces need root")
    args = args_for(data_dir, tmp_path)
    assert (args.net_list, args.net_notice) == (
        ["loopback"], "shaped-link setting left out: network namespaces need root")


def test_aggregation_rows_need_a_launcher_that_has_them(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(options, "launcher_flags", lambda: {"--net"})
    with pytest.raises(options.UsageError, match="has no --aggregation option"):
        args_for(data_dir, tmp_path, "--aggregations", "fednova")


def test_aggregations_parse_into_row_names_labels_and_flags():
    parsed = options.parse_aggregations("mean,fednova,weighted+nesterov=0.9+gl=0.7,mean")
    assert [(a.slug, a.label) for a in parsed] == [
        ("mean", "mean"), ("fednova", "fednova"),
        ("weighted-nesterov0.9-gl0.7", "weighted + Nesterov 0.9, gl 0.7")]
    assert parsed[2].argv() == ["--aggregation", "weighted", "--outer-momentum", "0.9",
                                "--nesterov", "--no-outer-adam", "-gl", "0.7", "--no-overlap",
                                "--prox-mu", "0",
                                "--no-scaffold", "--comm-dtype", "float32", "--low-rank", "0",
                                "--no-accumulate", "--no-carry", "--no-carry-slowest"]
    (carried,) = options.parse_aggregations("weighted+share=1+carry")
    assert (carried.slug, carried.label, carried.text) == (
        "weighted-share1-carry", "weighted, comm. share 1, iterations carried over the exchange",
        "weighted+share=1+carry")
    assert carried.argv()[-4:] == ["--carry", "--no-carry-slowest", "--comm-share", "1"]
    (everyone,) = options.parse_aggregations("weighted+share=1+carryall")
    assert (everyone.slug, everyone.label, everyone.text) == (
        "weighted-share1-carryall", "weighted, comm. share 1, iterations carried over the exchange "
        "(the slowest device's too)", "weighted+share=1+carryall")
    assert everyone.argv()[-4:] == ["--carry", "--carry-slowest", "--comm-share", "1"]
    (rounds,) = options.parse_aggregations("fednova+share=0.2+overlap+prox=0.1+scaffold+fp16")
    assert (rounds.slug, rounds.label) == (
        "fednova-share0.2-overlap-prox0.1-scaffold-fp16",
        "fednova, comm. share 0.2, overlap, FedProx mu 0.1, SCAFFOLD, float16 deltas")
    assert rounds.argv()[-13:] == ["--overlap", "--prox-mu", "0.1", "--scaffold",
                                   "--comm-dtype", "float16", "--low-rank", "0",
                                   "--no-accumulate", "--no-carry", "--no-carry-slowest",
                                   "--comm-share", "0.2"]
    (bounded,) = options.parse_aggregations("weighted+overlap+round=0.75")
    assert (bounded.slug, bounded.label, bounded.text) == (
        "weighted-round0.75-overlap", "weighted, rounds <= 0.75 s, overlap",
        "weighted+round=0.75+overlap")
    assert bounded.argv()[-2:] == ["--max-round-seconds", "0.75"]
    (factored,) = options.parse_aggregations("weighted+nesterov=0.9+gl=0.7+share=1+lowrank=4")
    assert (factored.slug, factored.label, factored.text) == (
        "weighted-nesterov0.9-gl0.7-share1-lowrank4",
        "weighted + Nesterov 0.9, gl 0.7, comm. share 1, rank-4 deltas",
        "weighted+nesterov=0.9+gl=0.7+share=1+lowrank=4")
    assert factored.argv()[-7:] == ["--low-rank", "4", "--no-accumulate", "--no-carry",
                                    "--no-carry-slowest", "--comm-share", "1"]
    (summed,) = options.parse_aggregations("sum+share=1+accumulate")
    assert (summed.slug, summed.label, summed.text) == (
        "sum-share1-accumulate", "sum, comm. share 1, gradients accumulated",
        "sum+share=1+accumulate")
    assert summed.argv()[-5:] == ["--accumulate", "--no-carry", "--no-carry-slowest",
                                  "--comm-share", "1"]
    (adam,) = options.parse_aggregations("sum+adam=0.9+gl=0.01+share=1")
    assert (adam.slug, adam.label, adam.text) == (
        "sum-adam0.9-gl0.01-share1", "sum + Adam 0.9, gl 0.01, comm. share 1",
        "sum+adam=0.9+gl=0.01+share=1")
    assert adam.argv()[:8] == ["--aggregation", "sum", "--outer-momentum", "0.9",
                               "--no-nesterov", "--outer-adam", "-gl", "0.01"]
    for bad in ("mean+share=0", "mean+share=2", "mean+prox=-1", "mean+overlapping",
                "mean+round=0", "mean+lowrank=0", "mean+lowrank=1.5"):
        with pytest.raises(options.UsageError, match="is not"):
            options.parse_aggregations(bad)


def test_a_tuning_run_lasts_a_quarter_of_the_budget_unless_given(data_dir, tmp_path):
    """The tuning horizon follows the runs it tunes: 10 s chose a worse rate for 60 s runs."""
    longer = args_for(data_dir, tmp_path, "--budget", "60")
    assert (longer.tune_budget, longer.byclass_tune_budget) == (15.0, 60.0)
    assert "--tune-budget 15 " in options.canonical_command(longer)
    given = args_for(data_dir, tmp_path, "--budget", "60", "--tune-budget", "10")
    assert (given.tune_budget, given.byclass_tune_budget) == (10.0, 40.0)


def test_defaults(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path)
    assert (args.target, args.table1_target, args.policy) == (0.85, 0.80, "dynamic")
    assert (args.lr_grid, args.repeats, args.budget, args.tune_budget) == (
        [0.001, 0.003, 0.01], 3, 40.0, 10.0)
    assert [a.slug for a in args.aggregation_list] == [
        "weighted-nesterov0.9-gl0.7-share1-carry",
        "weighted-nesterov0.9-gl0.7-share0.2-lowrank32-carry"]
    assert [a.slug for a in args.byclass_aggregation_list] == ["sum-share1-accumulate"]
    assert args.byclass_budget == 120.0
    assert (args.scenario_list, args.emulation, args.cpu_share) == (
        ["static", "shifting"], "auto", None)
    assert options.sync_cap(args) == 100.0


# ----------------------------------------------------------------------------- planning

def test_rows_per_aggregation_rule_and_split(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "esync,sync,local", "--niid",
                    "--aggregations", "mean,weighted+nesterov=0.9", "--scenarios", "static",
                    "--byclass-aggregations", "fednova,weighted+share=1")
    # by-class rows take the rules of --byclass-aggregations, each its own tuning group
    assert [(r.name, r.label, r.group) for r in plan.rows(args)] == [
        ("esync-mean", "ESync (mean)", "esync-mean"),
        ("esync-weighted-nesterov0.9", "ESync (weighted + Nesterov 0.9)",
         "esync-weighted-nesterov0.9"),
        ("sync", "SSGD", "sync"), ("local", "Standalone SGD", "local"),
        ("esync-fednova-niid", "ESync (fednova) (non-i.i.d.)", "esync-fednova-niid"),
        ("esync-weighted-share1-niid", "ESync (weighted, comm. share 1) (non-i.i.d.)",
         "esync-weighted-share1-niid"),
        ("sync-niid", "SSGD (non-i.i.d.)", "sync-niid")]
    assert "--byclass-aggregations fednova,weighted+share=1" in options.canonical_command(args)


def test_collectives_give_esync_and_ssgd_rows_an_allreduce_twin_with_their_rate(
        data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "esync,sync,async",
                    "--aggregations", "mean", "--collectives", "ps,allreduce", "--no-niid",
                    "--scenarios", "static")
    rows = plan.rows(args)
    assert [(r.name, r.group) for r in rows] == [
        ("esync-mean", "esync-mean"), ("esync-mean-allreduce", "esync-mean"),
        ("sync", "sync"), ("sync-allreduce", "sync"), ("async", "async")]
    twin = rows[3]
    assert twin.label == "SSGD over Horovod allreduce"
    assert twin.extra[-2:] == ("--collective", "allreduce")
    assert "--collective" not in rows[2].extra and "--collective" not in rows[4].extra
    assert len(plan.tuning_jobs(args, tmp_path, rows)) == 3 * len(args.lr_grid)


def test_esync_rows_pass_their_rule_and_tune_the_local_rate(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "esync", "--aggregations", "fednova",
                    "--no-niid")
    job = plan.full_jobs(args, tmp_path, plan.rows(args), plan.settings(args, RATES),
                         {"esync-fednova": 0.002})[0]
    argv = job.argv
    assert argv[argv.index("--aggregation") + 1] == "fednova"
    assert argv[argv.index("-ll") + 1] == "0.002" and "-l" not in argv


RATES = {"worker": ["150mbit"], "server": "150mbit"}


def test_shaped_setting_passes_the_namespace_options(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync", "--hosts", "1,1,2", "--no-niid",
                    "--repeats", "1", "--scenarios", "static")
    settings = plan.settings(args, RATES)
    jobs = plan.full_jobs(args, tmp_path, plan.rows(args), settings, {"sync": 0.001})
    assert [j.setting.name for j in jobs] == ["loopback", "netns"]
    assert "--net" not in jobs[0].argv
    assert jobs[1].argv[-9:] == ["--net", "netns", "--bandwidth", "150mbit",
                                 "--server-bandwidth", "150mbit", "--hosts", "1,1,2", "--quiet"]


def test_standalone_and_by_class_rows_run_in_the_first_setting_only(data_dir, tmp_path,
                                                                    full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--repeats", "2",
                    "--scenarios", "static", "--niid")
    jobs = plan.full_jobs(args, tmp_path, plan.rows(args), plan.settings(args, RATES),
                          {"sync": 0.001, "local": 0.001, "sync-niid": 0.0003})
    rep1 = [(j.setting.name, j.name) for j in jobs if j.rep == 1]
    assert rep1 == [("loopback", "sync"), ("loopback", "local"), ("loopback", "sync-niid"),
                    ("netns", "sync")]
    assert len(jobs) == 8
    # by-class rows train for --byclass-budget, by default 3 x --budget
    budgets = {(j.name, j.setting.name): j.budget for j in jobs if j.rep == 1}
    assert budgets[("sync-niid", "loopback")] == 3 * args.budget
    assert budgets[("local", "loopback")] == args.budget
    niid = next(j for j in jobs if j.name == "sync-niid")
    assert niid.argv[niid.argv.index("--max-seconds") + 1] == repr(3 * args.budget)
    args = args_for(data_dir, tmp_path, "--modes", "sync", "--byclass-budget", "70",
                    "--byclass-tune-budget", "25", "--repeats", "1", "--scenarios", "static",
                    "--sync-cap-seconds", "40", "--niid")
    rows = plan.rows(args)
    full = plan.full_jobs(args, tmp_path, rows, plan.settings(args, RATES),
                          {"sync": 0.001, "sync-niid": 0.0003})
    assert {j.name: j.budget for j in full if j.setting.name == "loopback"} == {
        "sync": args.budget, "sync-niid": 70.0}
    assert {j.row.group: j.budget for j in plan.tuning_jobs(args, tmp_path, rows)} == {
        "sync": args.tune_budget, "sync-niid": 25.0}


def test_tuning_runs_each_row_on_its_own_data_with_each_value(data_dir, tmp_path,
                                                                full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "async,dcasgd", "--tune-lr", "0.01,0.001",
                    "--byclass-tune-lr", "same", "--tune-budget", "5", "--scenarios", "static",
                    "--niid")
    jobs = plan.tuning_jobs(args, tmp_path, plan.rows(args), plan.settings(args, RATES)[0])
    # by-class rows tune for --byclass-tune-budget, by default 4 x --tune-budget
    assert [(j.row.group, j.lr, j.budget) for j in jobs] == [
        ("async", 0.001, 5.0), ("async", 0.01, 5.0), ("dcasgd", 0.001, 5.0),
        ("dcasgd", 0.01, 5.0), ("async-niid", 0.001, 20.0), ("async-niid", 0.01, 20.0),
        ("dcasgd-niid", 0.001, 20.0), ("dcasgd-niid", 0.01, 20.0)]
    assert jobs[2].argv[jobs[2].argv.index("-dcasgd") + 1] == "1"
    assert "-s" not in jobs[0].argv and jobs[4].argv[jobs[4].argv.index("-s") + 1] == "1"
    full = plan.full_jobs(args, tmp_path, plan.rows(args), plan.settings(args, RATES)[:1],
                          {"async": 0.01, "dcasgd": 0.01, "async-niid": 0.001,
                           "dcasgd-niid": 0.001})
    assert {j.name: j.lr for j in full} == {"async": 0.01, "dcasgd": 0.01, "async-niid": 0.001,
                                            "dcasgd-niid": 0.001}


@pytest.mark.parametrize("flags, splits", [
    ((), [0]), (("--data", "iid"), [0]), (("--data", "by-class"), [1]),
    (("--no-niid",), [0]), (("--niid",), [0, 1]), (("--data", "iid", "--no-niid"), [0]),
    (("--data", "by-class-shuffled"), [2]), (("--data", "iid,by-class-shuffled"), [0, 2])])
def test_data_option_picks_the_splits(data_dir, tmp_path, full_launcher, flags, splits):
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--scenarios", "static", *flags)
    assert args.splits == splits
    assert sorted({r.split for r in plan.rows(args)}) == splits
    assert "--data" in options.canonical_command(args)


@pytest.mark.parametrize("flags, message", [
    (("--data", "iid", "--niid"), "contradicts --niid"),
    (("--data", "by-class", "--modes", "local"), "only the cluster modes"),
    (("--data", "iid,by-kind"), "not a comma-separated list")])
def test_data_option_refuses_contradictions(data_dir, tmp_path, full_launcher, flags, message):
    with pytest.raises(options.UsageError, match=message):
        args_for(data_dir, tmp_path, *flags)


def test_standalone_runs_with_one_thread():
    assert plan.child_env("local")["OMP_NUM_THREADS"] == "1"


# ----------------------------------------------------------------------------- tuning choice

def synthetic_job(tmp_path, group, lr, accuracy_shift, *, mode="sync", ok=True, budget=1):
    row = plan.Row(name=group, label=group, mode=mode, split=0, group=group)
    job = plan.Job(row=row, setting=plan.Setting("loopback", "loopback"), rep=0, lr=lr,
                   root=tmp_path, folder=tmp_path, argv=[], log=tmp_path / "x.log",
                   budget=budget)
    if ok:
        root = tmp_path / f"{group}-{lr}"
        job.summary = summary_mod.summarize(
            logmaker.write_mode(root, mode, accuracy_shift=accuracy_shift))
    else:
        job.error = "exit code 1"
    return job


def test_best_rate_is_the_highest_final_accuracy(tmp_path):
    jobs = [synthetic_job(tmp_path, "sync", lr, shift)
            for lr, shift in ((0.001, -0.2), (0.003, 0.0), (0.01, -0.1))]
    assert metrics.best_learning_rates(jobs)["sync"]["lr"] == 0.003


def test_a_failed_tuning_run_never_wins(tmp_path):
    jobs = [synthetic_job(tmp_path, "sync", 0.001, -0.3),
            synthetic_job(tmp_path, "sync", 0.01, 0, ok=False)]
    chosen = metrics.best_learning_rates(jobs)["sync"]
    assert (chosen["lr"], chosen["scores"][0.01]) == (0.001, None)


def test_a_best_rate_at_an_edge_widens_the_grid_a_step_beyond_it(data_dir, tmp_path,
                                                                 full_launcher):
    args = args_for(data_dir, tmp_path, "--tune-lr", "0.001,0.003,0.009",
                    "--modes", "sync,async,local")
    rows = plan.rows(args)
    tuning = {"sync": {"lr": 0.009, "scores": {0.001: 0.5, 0.003: 0.6, 0.009: 0.7}},
              "async": {"lr": 0.001, "scores": {0.001: 0.7, 0.003: 0.6, 0.009: 0.5}},
              "local": {"lr": 0.003, "scores": {0.001: 0.5, 0.003: 0.7, 0.009: 0.6}}}
    wider = plan.widening_jobs(args, tmp_path, rows, tuning)
    assert {(j.row.group, j.lr) for j in wider} == {("sync", 0.027), ("async", 0.000333)}
    assert all(j.budget == args.tune_budget and j.setting.name == "loopback" for j in wider)
    # at most MAX_WIDENINGS values beyond the grid on one side
    far = {"sync": {"lr": 0.729, "scores": {v: v for v in (0.001, 0.003, 0.009, 0.027, 0.081,
                                                           0.243, 0.729)}}}
    assert plan.widening_jobs(args, tmp_path, rows, far) == []


def test_a_best_rate_moved_to_an_edge_by_the_second_seed_widens_with_both_seeds(
        data_dir, tmp_path, full_launcher):
    """Standalone SGD's seed-1 best was 0.003 (inside), the mean over both seeds then chose
    0.01, the grid's top, which no run beyond it had challenged (default benchmark of
    2026-11-28, noon). The value beyond runs with both seeds, so that its score is a mean over
    the same seeds as the scores it is compared with."""
    args = args_for(data_dir, tmp_path, "--tune-lr", "0.001,0.003,0.01", "--modes", "local",
                    "--seed", "5")
    rows = plan.rows(args)
    tuning = {"local": {"lr": 0.01, "scores": {0.001: 0.68, 0.003: 0.70, 0.01: 0.72},
                        "seeds": {0.001: 1, 0.003: 2, 0.01: 2}}}
    wider = plan.widening_jobs(args, tmp_path, rows, tuning)
    assert [(j.row.group, j.lr, j.seed) for j in wider] == [("local", 0.0316, 5),
                                                            ("local", 0.0316, 6)]
    assert [j.tag for j in wider] == ["tune local lr 0.0316", "tune local lr 0.0316 seed 6"]
    assert len({j.root for j in wider} | {j.root for j in plan.confirming_jobs(
        args, tmp_path, rows, tuning)}) == 6                 # no run overwrites another
    # one seed behind the best score: one run, as before the confirmations
    tuning["local"]["seeds"][0.01] = 1
    assert [j.seed for j in plan.widening_jobs(args, tmp_path, rows, tuning)] == [5]


def test_tuning_scores_the_mean_of_the_second_half_not_the_last_checkpoint(tmp_path):
    # "steady" holds 0.6 over its second half; "lucky" swings and ends higher, at 0.7
    curves = {0.001: [(1, 1.0, 0.3), (2, 2.0, 0.6), (3, 3.0, 0.6), (4, 4.0, 0.6)],
              0.003: [(1, 1.0, 0.3), (2, 2.0, 0.3), (3, 3.0, 0.4), (4, 4.0, 0.7)]}
    jobs = []
    for lr, records in curves.items():
        job = synthetic_job(tmp_path, "sync", lr, 0.0)
        folder = tmp_path / f"sync-{lr}" / logmaker.NETWORK / "sync"
        logmaker.write_evaluations(folder, records)
        job.summary = summary_mod.summarize(folder)
        jobs.append(job)
    chosen = metrics.best_learning_rates(jobs)["sync"]
    assert chosen["scores"] == {0.001: pytest.approx(0.6), 0.003: pytest.approx(1.4 / 3)}
    assert chosen["lr"] == 0.001


def test_each_iid_rows_two_best_rates_run_again_with_the_next_seed(data_dir, tmp_path,
                                                                    full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,async", "--tune-lr",
                    "0.001,0.003,0.009", "--byclass-tune-lr", "same", "--seed", "5", "--niid")
    rows = plan.rows(args)
    tuning = {"sync": {"lr": 0.003, "scores": {0.001: 0.5, 0.003: 0.7, 0.009: 0.6}},
              "async": {"lr": 0.001, "scores": {0.001: 0.7, 0.003: None, 0.009: 0.1}},
              "sync-niid": {"lr": 0.001, "scores": {0.001: 0.3, 0.003: 0.2, 0.009: 0.1}}}
    jobs = plan.confirming_jobs(args, tmp_path, rows, tuning)
    assert [(j.row.group, j.lr, j.seed, j.budget) for j in jobs] == [
        ("sync", 0.003, 6, args.tune_budget), ("sync", 0.009, 6, args.tune_budget),
        ("async", 0.001, 6, args.tune_budget),
        ("async", 0.009, 6, args.tune_budget)]        # a failed rate is not retried
    # a by-class row's (longer) runs do not run again
    assert plan.confirmed_rates(next(r for r in rows if r.split)) == 0
    assert all(j.tuning and j.argv[j.argv.index("--seed") + 1] == "6" for j in jobs)
    assert jobs[0].tag == "tune sync lr 0.003 seed 6"
    assert len({j.root for j in jobs} | {j.root for j in plan.tuning_jobs(args, tmp_path, rows)}
               ) == len(jobs) + 12                                # no run overwrites another
    assert len(plan.planned_confirmations(args, tmp_path, rows)) == 4


def test_one_device_alone_confirms_its_best_rates_with_two_more_seeds(data_dir, tmp_path,
                                                                       full_launcher):
    """Standalone SGD chose 0.01 on seeds 1 and 2 and diverged in the seed-3 repeat of two
    default benchmarks in a row; its runs are cheap, so its best rates see a third seed, and a
    rate that diverges there scores about 0.1 in that seed and loses on the mean."""
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--tune-lr", "0.001,0.003,0.01",
                    "--no-niid", "--seed", "5")
    rows = plan.rows(args)
    tuning = {"sync": {"lr": 0.003, "scores": {0.001: 0.5, 0.003: 0.7, 0.01: 0.6}},
              "local": {"lr": 0.01, "scores": {0.001: 0.70, 0.003: 0.772, 0.01: 0.786}}}
    jobs = plan.confirming_jobs(args, tmp_path, rows, tuning)
    assert [(j.row.group, j.lr, j.seed) for j in jobs] == [
        ("sync", 0.003, 6), ("sync", 0.01, 6),
        ("local", 0.01, 6), ("local", 0.01, 7), ("local", 0.003, 6), ("local", 0.003, 7)]
    assert len({j.root for j in jobs}) == 6 and jobs[3].tag == "tune local lr 0.01 seed 7"
    # the third seed diverges at 0.01: the mean over three seeds now prefers 0.003
    scores = {(0.003, 5): 0.772, (0.003, 6): 0.772, (0.003, 7): 0.77,
              (0.01, 5): 0.786, (0.01, 6): 0.786, (0.01, 7): 0.1}
    runs = []
    for (lr, seed), score in scores.items():
        job = synthetic_job(tmp_path / f"s{seed}", "local", lr, 0.0, mode="local")
        job.seed = seed
        folder = tmp_path / f"s{seed}" / f"local-{lr}" / logmaker.NETWORK / "local"
        logmaker.write_evaluations(folder, [(1, 1.0, score), (2, 2.0, score)])
        job.summary = summary_mod.summarize(folder)
        runs.append(job)
    chosen = metrics.best_learning_rates(runs)["local"]
    assert (chosen["lr"], chosen["seeds"][0.01]) == (0.003, 3)


def test_by_class_rows_are_tuned_over_their_own_grid_and_widen_by_its_step(data_dir, tmp_path,
                                                                         full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync", "--tune-lr", "0.001,0.003,0.009",
                    "--byclass-tune-lr", "0.0001,0.001", "--niid")
    rows = plan.rows(args)
    jobs = plan.tuning_jobs(args, tmp_path, rows)
    assert [(j.row.group, j.lr, j.budget) for j in jobs] == [
        ("sync", 0.001, args.tune_budget), ("sync", 0.003, args.tune_budget),
        ("sync", 0.009, args.tune_budget), ("sync-niid", 0.0001, args.byclass_tune_budget),
        ("sync-niid", 0.001, args.byclass_tune_budget)]
    assert all("-s" in j.argv for j in jobs[3:]) and all("-s" not in j.argv for j in jobs[:3])
    tuning = {"sync": {"lr": 0.009, "scores": {0.001: 0.5, 0.003: 0.6, 0.009: 0.7}},
              "sync-niid": {"lr": 0.0001, "scores": {0.0001: 0.4, 0.001: 0.1}}}
    wider = plan.widening_jobs(args, tmp_path, rows, tuning)
    assert {(j.row.group, j.lr) for j in wider} == {("sync", 0.027), ("sync-niid", 1e-05)}
    assert "--byclass-tune-lr 0.0001,0.001" in options.canonical_command(args)
    # the default: each by-class row three rates a grid step apart around its mode's usual
    # choice (ESync sat at chance on the i.i.d. grid), widening by that step
    default = args_for(data_dir, tmp_path, "--modes", "esync,sync,async,dcasgd", "--niid")
    assert default.byclass_lr_grid == "auto" and default.lr_grid == [0.001, 0.003, 0.01]
    assert default.byclass_tune_budget == 4 * default.tune_budget
    byclass = [j for j in plan.tuning_jobs(default, tmp_path, plan.rows(default)) if j.row.split]
    grids = {}
    for job in byclass:
        grids.setdefault(job.row.mode, []).append(job.lr)
    assert grids == {"esync": [3e-05, 9.49e-05, 0.0003], "sync": [0.000316, 0.001, 0.00316],
                     "async": [9.49e-05, 0.0003, 0.000949],
                     "dcasgd": [9.49e-05, 0.0003, 0.000949]}
    assert all(j.budget == default.byclass_tune_budget for j in byclass)
    group = next(j.row.group for j in byclass if j.row.mode == "sync")
    at_top = {group: {"lr": 0.00316, "scores": {0.000316: 0.2, 0.001: 0.3, 0.00316: 0.31}}}
    assert [j.lr for j in plan.widening_jobs(default, tmp_path, plan.rows(default), at_top)] \
        == [0.00999]
    assert "--byclass-tune-lr auto" in options.canonical_command(default)
    assert "three rates a grid step" in options.describe_byclass_grid(default)
    same = args_for(data_dir, tmp_path, "--tune-lr", "0.01,0.02", "--byclass-tune-lr", "same")
    assert same.byclass_lr_grid == same.lr_grid == [0.01, 0.02]
    assert args_for(data_dir, tmp_path, "--tune-lr", "none").byclass_lr_grid is None


def test_a_by_class_row_whose_short_runs_stay_at_chance_runs_its_best_rates_longer(
        data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,async", "--tune-lr", "0.001,0.003",
                    "--byclass-tune-lr", "0.0001,0.0003,0.001", "--niid")
    rows = plan.rows(args)
    tuning = {"sync": {"lr": 0.001, "scores": {0.001: 0.12, 0.003: 0.11}},     # i.i.d.: never
              "sync-niid": {"lr": 0.0001, "scores": {0.0001: 0.19, 0.0003: 0.16, 0.001: 0.1}},
              "async-niid": {"lr": 0.0003, "scores": {0.0001: 0.3, 0.0003: 0.39, 0.001: 0.1}}}
    jobs = plan.lengthening_jobs(args, tmp_path, rows, tuning)
    budget = args.byclass_tune_budget * plan.LENGTHENING
    assert [(j.row.group, j.lr, j.budget, j.seed) for j in jobs] == [
        ("sync-niid", 0.0001, budget, args.seed), ("sync-niid", 0.0003, budget, args.seed)]
    assert all(j.tuning and "-s" in j.argv for j in jobs)
    assert all(j.argv[j.argv.index("--max-seconds") + 1] == repr(budget) for j in jobs)
    assert len({j.root for j in jobs} | {j.root for j in plan.tuning_jobs(args, tmp_path, rows)}
               ) == len(jobs) + 10                                # no run overwrites another
    # its short runs do not widen its grid (0.0001 leads by noise at chance)...
    assert "sync-niid" not in [j.row.group for j in plan.widening_jobs(args, tmp_path, rows,
                                                                        tuning)]
    # lengthened once: a group whose choice already came from longer runs is left alone
    tuning["sync-niid"]["short_scores"] = {0.001: 0.1}
    assert plan.lengthening_jobs(args, tmp_path, rows, tuning) == []
    # ... the longer runs do: their best at the edge of every rate tried gets the next one,
    # as long as they ran; one inside (the short runs' rates count) does not
    tuning["sync-niid"].update(lr=0.0001, budget=budget, scores={0.0001: 0.3, 0.0003: 0.2},
                               short_scores={0.0001: 0.19, 0.0003: 0.16, 0.001: 0.1})
    wider = [j for j in plan.widening_jobs(args, tmp_path, rows, tuning) if j.row.split]
    assert [(j.row.group, j.lr, j.budget) for j in wider] == [("sync-niid", 3.16e-05, budget)]
    assert wider[0].root.name == f"lr3.16e-05-{budget:g}s"
    tuning["sync-niid"].update(lr=0.0003, scores={0.0001: 0.2, 0.0003: 0.3})
    assert not [j for j in plan.widening_jobs(args, tmp_path, rows, tuning) if j.row.split]


def test_a_groups_longest_tuning_runs_decide(tmp_path):
    # 0.01 wins the short runs; run again for longer, 0.003 is ahead
    short = [synthetic_job(tmp_path, "sync", lr, shift)
             for lr, shift in ((0.001, -0.3), (0.003, -0.05), (0.01, 0.0))]
    long = [synthetic_job(tmp_path / "long", "sync", lr, shift, budget=2)
            for lr, shift in ((0.003, 0.0), (0.01, -0.1))]
    chosen = metrics.best_learning_rates(short + long)["sync"]
    assert chosen["lr"] == 0.003
    assert chosen["budget"] == 2 and sorted(chosen["scores"]) == [0.003, 0.01]
    assert chosen["scores"][0.003] == pytest.approx(metrics.tuning_score(long[0]))
    assert chosen["short_scores"] == {lr: pytest.approx(metrics.tuning_score(j))
                                      for lr, j in zip((0.001, 0.003, 0.01), short)}
    text = "\n".join(report.tuning_section(
        argparse.Namespace(lr_grid=[0.001, 0.003, 0.01], byclass_lr_grid=[0.001],
                           splits=[0], tune_budget=1, byclass_tune_budget=1, seed=1),
        {"sync": chosen}, ["sync"], {"sync": "SSGD"}))
    assert f"**{chosen['scores'][0.003]:.3f}⁺ ({chosen['short_scores'][0.003]:.3f})**" in text
    assert f"| {chosen['short_scores'][0.001]:.3f} |" in text         # only a short run
    assert "ran again for 2 s, and those runs decided" in text


def test_a_rate_that_diverges_with_the_second_seed_loses(tmp_path):
    # 0.01 wins on the first seed and falls behind on the second; 0.003 holds on both
    first = [synthetic_job(tmp_path, "sync", lr, shift)
             for lr, shift in ((0.001, -0.3), (0.003, -0.05), (0.01, 0.0))]
    second = [synthetic_job(tmp_path / "seed2", "sync", lr, shift)
              for lr, shift in ((0.003, -0.05), (0.01, -0.3))]
    assert metrics.best_learning_rates(first)["sync"]["lr"] == 0.01
    chosen = metrics.best_learning_rates(first + second)["sync"]
    assert chosen["lr"] == 0.003
    assert chosen["seeds"] == {0.001: 1, 0.003: 2, 0.01: 2}
    assert chosen["scores"][0.01] == pytest.approx(
        (metrics.tuning_score(first[2]) + metrics.tuning_score(second[1])) / 2)


def test_ties_go_to_the_smaller_rate(tmp_path):
    jobs = [synthetic_job(tmp_path, "sync", lr, 0.0) for lr in (0.01, 0.001)]
    assert metrics.best_learning_rates(jobs)["sync"]["lr"] == 0.001


def test_a_smaller_rate_within_the_tolerance_of_the_best_wins(tmp_path):
    near = metrics.TUNING_TOLERANCE / 2
    jobs = [synthetic_job(tmp_path, "sync", 0.003, -near),
            synthetic_job(tmp_path, "sync", 0.01, 0.0),
            synthetic_job(tmp_path, "sync", 0.001, -3 * metrics.TUNING_TOLERANCE)]
    assert metrics.best_learning_rates(jobs)["sync"]["lr"] == 0.003


# ----------------------------------------------------------------------------- numbers

def test_physical_limit_is_bounded_by_the_cores(tmp_path):
    local = summary_mod.summarize(logmaker.write_mode(tmp_path, "local"))
    tp = 8 * logmaker.BATCH / (8 * logmaker.STANDALONE.step)       # 128 samples/s
    limit = metrics.physical_limit(local, [1, 1, 4, 8], cores=2)
    assert limit["cluster_limit"] == pytest.approx(min(2.375 * tp, 2 * tp))


def test_physical_limit_is_the_devices_sum_when_cores_suffice(tmp_path):
    local = summary_mod.summarize(logmaker.write_mode(tmp_path, "local"))
    limit = metrics.physical_limit(local, [1, 4, 8], cores=8)
    assert limit["cluster_limit"] == pytest.approx(1.375 * 128)


def test_on_real_machines_no_cores_bound_the_physical_limit(tmp_path):
    # Two devices at the probes' slow-downs 1 and 2 on hosts of their own: 128 + 64 samples/s,
    # however few cores the launching machine has.
    local = summary_mod.summarize(logmaker.write_mode(tmp_path, "local"))
    limit = metrics.physical_limit(local, [1, 2], cores=1, one_machine=False)
    assert (limit["cluster_limit"], limit["cores_bound"]) == (pytest.approx(192), None)
    from esync.benchmark import report
    line = report._limit_line([limit], {"capped": False})[0]
    assert "192.0 samples/s" in line and "cores" in line and "min(" not in line


def test_matching_rate_for_lenet_at_20_ms():
    # 8 x 1,724,320 B / ((374 / 60) x 20 ms) = 111 Mbit/s
    bit_s = shaping.matching_rate_bit_s(1_724_320, 0.020)
    assert (round(bit_s / 1e6), shaping.tc_rate(bit_s)) == (111, "111mbit")


@pytest.mark.parametrize("text, bit_s", [("100mbit", 1e8), ("2gbit", 2e9), ("500kbit", 5e5),
                                          ("10mbps", 8e7)])
def test_tc_rates_read_back(text, bit_s):
    assert shaping.rate_bit_s(text) == bit_s


# ----------------------------------------------------------------------------- report

# Per setting and row: seconds added to logmaker's evaluation times in repeats 1 and 2.
# logmaker's ESync crosses 0.80 between 0.5 at 1 s and 0.81 at 2 s: the report's time to it
# (interpolated) is this, plus the shift.
CROSSING = 1 + 0.30 / 0.31
SHIFTS = {"loopback": {"esync-mean": (0, 1), "sync": (0, 2)},
          "netns": {"esync-mean": (-1, 0), "sync": (0, 2)},
          "shifting": {"esync-mean-dynamic": (0, 1), "esync-mean-planned": (1.5, 1.5)}}


@pytest.fixture
def synthetic(data_dir, tmp_path, full_launcher):
    """report.render over logmaker's logs, two repeats: esync (mean), sync, local in two network
    settings, and the shifting scenario's rows. Budget 4 s, target 0.80; SSGD's static runs are
    extended (their records after 4 s count only for Table 1). Evaluation times are shifted per
    repeat by ``SHIFTS``: loopback ESync scores 0.80 first at 2 s and 3 s (crossed at ``CROSSING``
    and ``CROSSING`` + 1), shaped links at 1 s and
    2 s; SSGD at 6 s and 8 s (after the budget); standalone SGD at 0.75 s in both."""
    args = args_for(data_dir, tmp_path, "--modes", "esync,sync,local", "--aggregations", "mean",
                    "--no-niid", "--tune-lr", "0.001,0.003", "--repeats", "2", "--budget", "4",
                    "--target", "0.8", "--shift-at", "2")
    out = Path(args.out)
    rows = plan.rows(args)
    settings = plan.settings(args, RATES)
    jobs = []
    for rep in (1, 2):
        for setting in settings:
            for row in rows:
                if row.scenario != setting.scenario or (setting.name == "netns"
                                                        and row.name == "local"):
                    continue
                root = out / setting.name / f"rep{rep}" / row.name
                mode_dir = logmaker.write_mode(root, row.mode)
                shift = SHIFTS[setting.name].get(row.name, (0, 0))[rep - 1]
                if row.mode != "local":
                    logmaker.write_evaluations(mode_dir, [(r, t + shift, a) for r, t, a
                                                          in logmaker.EVALUATIONS[row.mode]])
                job = plan.Job(row=row, setting=setting, rep=rep, lr=0.001, root=root,
                               folder=mode_dir, argv=["python", "-m", "esync.launch"],
                               log=out / "runs" / f"{setting.name}-{row.name}.log", budget=4,
                               seed=rep, returncode=0,
                               extended=row.mode == "sync" and setting.scenario == "static")
                job.summary = summary_mod.summarize(mode_dir)
                jobs.append(job)
    tune = [synthetic_job(tmp_path, "sync", lr, s) for lr, s in ((0.001, -0.3), (0.003, 0))]
    results = metrics.results(args, jobs, [s.name for s in settings])
    labels = {r.name: r.label for r in rows}
    shaping_info = {"reference": shaping.REFERENCE, "ratio": shaping.RATIO,
                    "measured": {"model_bytes": 1_724_320, "compute_s": 0.02},
                    "derived_bit_s": shaping.matching_rate_bit_s(1_724_320, 0.02),
                    "derived": "111mbit", "worker": ["111mbit"], "server": "111mbit",
                    "auto": True}
    standalone = {"capped": False, "share": None, "reason": "--emulation sleep"}
    text = report.render(args, jobs=jobs, tune_jobs=[], results=results, settings=settings,
                         names=[r.name for r in rows if r.scenario == "static"], labels=labels,
                         tuning=metrics.best_learning_rates(tune), shaping=shaping_info,
                         written=[], problems=[], command="esync-benchmark",
                         started=datetime(2026, 1, 1), seconds=60,
                         emulation=emulation.survey(jobs), standalone=standalone)
    return {"text": text, "args": args, "jobs": jobs, "results": results, "out": out,
            "standalone": standalone, "emulation": emulation.survey(jobs)}


@pytest.fixture
def synthetic_report(synthetic):
    return synthetic["text"]


def side_by_side_row(text, name):
    section = text.split("## Results side by side")[1].split("\n## ")[0]
    line = next(ln for ln in section.splitlines() if f"(`{name}`)" in ln)
    return [c.strip() for c in line.strip().strip("|").split("|")]


def section_row(text, heading, name):
    section = text.split(heading)[1].split("\n## ")[0]
    line = next(ln for ln in section.splitlines() if f"(`{name}`)" in ln)
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_report_shows_medians_and_ranges_side_by_side(synthetic_report):
    # SSGD cut at the 4 s budget never reached 0.80 (its median: > 4 s): a lower bound.
    loopback, shaped = CROSSING + 0.5, CROSSING - 0.5      # medians of the two repeats
    assert side_by_side_row(synthetic_report, "esync-mean")[1:] == [
        "2.5 (2.0–3.0)", f"> {4 / loopback:.2f}×", f"{0.75 / loopback:.2f}× (over Standalone SGD)",
        "0.860 (0.860–0.860)",
        "1.5 (1.0–2.0)", f"> {4 / shaped:.2f}×", f"{0.75 / shaped:.2f}× (over Standalone SGD)",
        "0.860 (0.860–0.860)"]
    # Not reached within the budget: at most 0.75 s / 4 s as fast as standalone SGD; its final
    # accuracy is the last record within the budget: 0.7 at 4 s, 0.4 at 4 s (+2 s).
    assert side_by_side_row(synthetic_report, "sync")[1:5] == [
        "not reached", "n/a", "< 0.19× (over Standalone SGD)", "0.550 (0.400–0.700)"]


def test_report_gives_each_rows_spread_raw_and_at_the_machines_pace(synthetic_report):
    # logmaker's devices compute at the same pace in every repeat: the spread stays as it is.
    row = section_row(synthetic_report, "## Repeats and the machine's pace", "esync-mean")
    ratio = f"{(CROSSING + 1) / CROSSING:.2f}×"
    assert row[1:] == ["loopback", f"{CROSSING:.1f}, {CROSSING + 1:.1f}", row[3], ratio, ratio]
    assert row[3].count(",") == 1 and "?" not in row[3]
    section = synthetic_report.split("## Repeats and the machine's pace")[1].split("\n## ")[0]
    assert "(`sync`) | loopback" not in section     # never reached 0.80 within the budget


def test_table1_gives_ssgd_its_longer_run(synthetic_report):
    heading = "## Table 1: time to 0.80 test accuracy and speedup over SSGD"
    assert "SSGD ran until it reached 0.80 or for at most **10 s**" in synthetic_report
    assert section_row(synthetic_report, heading, "sync")[1:] == [
        "7.0 (6.0–8.0)", "—", "7.0 (6.0–8.0)", "—"]
    assert section_row(synthetic_report, heading, "esync-mean")[1:] == [
        "2.5 (2.0–3.0)", f"{7 / (CROSSING + 0.5):.2f}×", "1.5 (1.0–2.0)",
        f"{7 / (CROSSING - 0.5):.2f}×"]
    assert section_row(synthetic_report, heading, "local")[1:3] == ["0.8 (0.8–0.8)", "9.33×"]
    assert "- loopback: SSGD reached 0.80 in every run." in synthetic_report


def test_shifting_scenario_has_its_own_table(synthetic_report):
    heading = "## Scenario: a fast device slows down (shifting)"
    assert "device cpu1 becomes 6× slower after 2 s" in synthetic_report
    assert "`--speed-schedule cpu1:1@0,6@2`" in synthetic_report
    dynamic = section_row(synthetic_report, heading, "esync-mean-dynamic")
    planned = section_row(synthetic_report, heading, "esync-mean-planned")
    assert dynamic[1:4] == ["2.5 (2.0–3.0)", f"{6 / (CROSSING + 0.5):.2f}×",
                            "0.860 (0.860–0.860)"]
    assert planned[1:3] == ["3.5 (3.5–3.5)", f"{6 / (CROSSING + 1.5):.2f}×"]
    names = [ln.split("(`")[1].split("`")[0] for ln in
             synthetic_report.split(heading)[1].split("\n## ")[0].splitlines()
             if ln.startswith("| ") and "(`" in ln]
    assert names == ["esync-mean-dynamic", "esync-mean-planned", "sync"]


def test_report_says_the_emulation_and_the_standalone_cap(synthetic):
    text = synthetic["text"]
    assert ("- emulation: **sleep (older launcher)** in every cluster run (no run wrote a "
            "cluster.json: the launcher predates them)") in text
    assert "- standalone SGD: uncapped, a whole core and one thread (--emulation sleep)" in text


def test_benchmark_json_keeps_every_repeat_and_the_aggregates(synthetic):
    args = synthetic["args"]
    report.write_outputs(args, synthetic["text"], jobs=synthetic["jobs"], tune_jobs=[],
                         results=synthetic["results"], tuning=None, shaping=None, problems=[],
                         command="esync-benchmark", started=datetime(2026, 1, 1), seconds=1,
                         emulation=synthetic["emulation"], standalone=synthetic["standalone"])
    data = json.loads((synthetic["out"] / "benchmark.json").read_text())
    loop = data["settings"]["loopback"]
    times = [CROSSING, CROSSING + 1]
    assert [m["time_to_target"] for m in loop["rows"]["esync-mean"]] == pytest.approx(times)
    assert [m["time_to_target_checkpoint"] for m in loop["rows"]["esync-mean"]] == [2.0, 3.0]
    assert [m["time_to_target_uncut"] for m in loop["rows"]["sync"]] == [6.0, 8.0]
    assert loop["aggregates"]["esync-mean"]["time"] == {
        "median": pytest.approx(CROSSING + 0.5), "min": pytest.approx(times[0]),
        "max": pytest.approx(times[1]), "n": 2, "reached": 2, "values": pytest.approx(times)}
    assert loop["aggregates"]["sync"]["time"]["median"] is None          # not reached: null
    assert loop["aggregates"]["esync-mean"]["vs_sync"] == {
        "value": pytest.approx(4 / (CROSSING + 0.5)), "bound": ">", "overlap": False,
        "other": "sync"}
    assert data["config"]["seeds"] == [1, 2]
    assert sorted({(r["rep"], r["seed"]) for r in data["runs"]}) == [(1, 1), (2, 2)]


def test_report_gives_the_grid_with_the_chosen_rate_in_bold(synthetic_report):
    line = next(ln for ln in synthetic_report.splitlines() if ln.startswith("| SSGD (`sync`)")
                and "**" in ln)
    # scores: the mean of the checkpoints of each run's second half (4, 6 and 8 s of 8)
    second_half = (0.7 + 0.8 + 0.84) / 3
    assert line == f"| SSGD (`sync`) | {second_half - 0.3:.3f} | **{second_half:.3f}** | 0.003 |"


def test_report_states_how_the_shaped_rate_was_derived(synthetic_report):
    assert ("8 × 1.72 MB / (6.23 × 20.0 ms) = 111 Mbit/s, used as `111mbit`"
            in synthetic_report)
    assert "ResNet-18 on GPUs in a lab on 1 GbE" in synthetic_report


def test_report_physical_limit_line(synthetic_report):
    section = synthetic_report.split("## Results: loopback")[1]
    assert "= min(304.0, 256.0) = **256.0 samples/s**" in section


def test_device_columns_name_the_host_only_where_two_hosts_share_a_device_name():
    """Shaped links: the cluster's devices sit on emulated hosts, the standalone run on the
    machine itself; both have a cpu0, which would make two identical column titles."""
    from esync.benchmark.report import _device_headers

    def run(devices):
        return {"devices": {d: {"slowdown": s} for d, s in devices.items()}}

    per_rep = {"esync": [run({"host0/cpu0": 1, "host1/cpu1": 1, "host2/cpu2": 4})],
               "local": [run({"vm/cpu0": 1})]}
    devices = ["host0/cpu0", "host1/cpu1", "host2/cpu2", "vm/cpu0"]
    assert _device_headers(devices, per_rep) == [
        "host0/cpu0 (×1)", "cpu1 (×1)", "cpu2 (×4)", "vm/cpu0 (×1)"]


def test_report_physical_limit_under_cpu_caps():
    """A capped standalone run is one x1 device with `share` of a core: a core gives tp/share."""
    local = {"_totals": {"throughput": 100.0}}
    limit = metrics.physical_limit(local, [1, 1, 4, 8], cores=2, share=0.5)
    assert (limit["devices_sum"], limit["cores_bound"], limit["cluster_limit"]) == (
        237.5, 400.0, 237.5)
    line = report._limit_line([limit], {"capped": True, "share": 0.5})[0]
    assert "= **237.5 samples/s**" in line and "capped at 0.5 core" in line


# ----------------------------------------------------------------------------- statistics

def test_median_and_range_count_a_missed_target_as_slower_than_any_time():
    t = stats.spread([30.0, None, 40.0], censored=True)
    assert (t.median, t.low, t.high, t.n, t.reached) == (40.0, 30.0, stats.INF, 3, 2)
    assert stats.time_cell(t) == "40.0 (30.0–not reached; 2/3 reached)"
    half = stats.spread([30.0, None, None], censored=True)
    assert stats.time_cell(half) == "not reached (1/3 runs did; fastest 30.0)"
    assert stats.time_cell(stats.spread([31.25], censored=True)) == "31.2"
    assert stats.value_cell(stats.spread([0.85, 0.87, None, 0.86]), ".3f") == \
        "0.860 (0.850–0.870)"


def test_ranges_overlap_where_they_share_a_point():
    def s(*v):
        return stats.spread(v, censored=True)
    assert stats.overlap(s(10, 20), s(15, 30)) and stats.overlap(s(10, 20), s(20, 30))
    assert not stats.overlap(s(10, 12), s(13, 20))
    assert stats.overlap(s(10, None), s(None, None))       # both missed it somewhere
    assert not stats.overlap(s(10, 11), s(None, None))


def test_speedups_are_ratios_of_medians_and_say_when_ranges_overlap():
    def s(*v):
        return stats.spread(v, censored=True)
    clear = stats.speedup(s(10, 11, 12), s(20, 22, 24), row_horizon=60, reference_horizon=60)
    assert stats.speedup_cell(clear) == "2.00×"
    # One slow repeat (30 s) puts the row's range over the reference's: not a clear win.
    noisy = stats.speedup(s(10, 11, 30), s(20, 22, 24), row_horizon=60, reference_horizon=60)
    assert stats.speedup_cell(noisy) == "2.00× (ranges overlap: not a clear win)"
    lower = stats.speedup(s(10, 10, 10), s(None, None, 50), row_horizon=60,
                          reference_horizon=100)
    assert stats.speedup_cell(lower) == "> 10.00×"
    upper = stats.speedup(s(None, None, 50), s(20, 20, 20), row_horizon=40,
                          reference_horizon=40)
    assert stats.speedup_cell(upper) == "< 0.50×"
    # The row's median missed the target, but one repeat beat the reference's time.
    lucky = stats.speedup(s(None, 15, None), s(20, 20, 20), row_horizon=40,
                          reference_horizon=40)
    assert stats.speedup_cell(lucky) == "< 0.50× (ranges overlap: not a clear loss)"
    assert stats.speedup(s(None), s(None), row_horizon=1, reference_horizon=1) is None


def metrics_for(times, accuracies=None):
    accuracies = accuracies or [0.8] * len(times)
    return [None if t == "failed" else {
        "time_to_target": t, "final_accuracy": a, "throughput": 100.0,
        "throughput_fraction": 0.5, "mean_computing_time_ratio": 0.7,
        "traffic_bytes_per_s": 1e6, "state_requests_per_round": 0.0}
        for t, a in zip(times, accuracies)]


def test_repeats_scaled_to_the_rows_median_pace():
    # Paces 50, 40, 60 ms per iteration (median 50): 30 s at 40 ms is 37.5 s at 50 ms.
    times, paces = [20.0, 30.0, 24.0], [0.05, 0.04, 0.06]
    assert stats.paced(times, paces) == pytest.approx([20.0, 37.5, 20.0])
    assert stats.paced([20.0, None], [0.05, 0.04]) == pytest.approx([20.0 * 0.045 / 0.05, None])
    assert stats.paced([20.0, 30.0], [0.05, None]) == [20.0, None]
    assert stats.repeat_ratio(stats.spread([20.0, 30.0, 24.0], censored=True)) == 1.5
    assert stats.repeat_ratio(stats.spread([20.0, None], censored=True)) is None   # censored
    assert stats.repeat_ratio(stats.spread([20.0], censored=True)) is None
    per_rep = {"esync-mean": [dict(m, x1_seconds_per_sample=p) for m, p
                              in zip(metrics_for(times), paces)],
               "async": metrics_for([10, 12])}                     # paces not recorded
    rows = stats.aggregate(per_rep, horizon=60)
    assert rows["esync-mean"]["paced_time"].values == pytest.approx((20.0, 37.5, 20.0))
    assert rows["esync-mean"]["time"].values == (20.0, 30.0, 24.0)     # raw stays raw
    assert rows["async"]["paced_time"] is None
    lines = pace.section({"loopback": per_rep, "netns": {"local": per_rep["esync-mean"]},
                          "shifting": {"local": per_rep["esync-mean"]}},
                         target=0.85, batch=64, labels={"esync-mean": "ESync"})
    table = [ln for ln in lines if ln.startswith("| ") and "---" not in ln][1:]
    assert table[0] == "| ESync | loopback | 20.0, 30.0, 24.0 | 3200.0, 2560.0, 3840.0 | 1.50× | 1.88× |"
    assert table[1] == "| async | loopback | 10.0, 12.0 | ?, ? | 1.20× | — |"
    assert [ln.split("|")[2].strip() for ln in table[2:]] == ["netns"]   # one device alone once


def test_x1_seconds_per_sample_is_the_fastest_x1_device():
    def device(slowdown, computed, samples):
        return {"slowdown": slowdown, "compute_time_list": computed,
                "num_samples_list": samples}
    summary = {"_totals": {}, "h": {"cpu0": device(1.0, [1.0, 1.0], [64, 64]),     # 15.6 ms
                                    "cpu1": device(1.0, [3.0, 3.0], [64, 64]),     # slowed
                                    "cpu2": device(4.0, [0.5], [64])}}              # a x4 device
    assert metrics.x1_seconds_per_sample(summary) == pytest.approx(2.0 / 128)
    assert metrics.x1_seconds_per_sample({"h": {"cpu2": device(4.0, [0.5], [64])}}) == \
        pytest.approx(0.5 / 64)                 # the fastest factor there is
    assert metrics.x1_seconds_per_sample({"h": {"cpu0": device(1.0, [None], [64])}}) is None


def test_pace_command_reads_an_earlier_benchmark_folder(tmp_path, capsys):
    """A benchmark that ran before the report had the section: the paces come from each run's
    summary, found through benchmark.json's runs."""
    runs, rows = [], []
    for rep, (t, seconds) in enumerate([(20.0, 1.0), (30.0, 0.8)], start=1):
        mode_dir = tmp_path / "runs" / f"rep{rep}" / "lenet" / "esync"
        mode_dir.mkdir(parents=True)
        (mode_dir / summary_mod.summary_name("esync")).write_text(json.dumps(
            {"h": {"cpu0": {"slowdown": 1.0, "compute_time_list": [seconds],
                            "num_samples_list": [64]}}}))
        runs.append({"setting": "loopback", "rep": rep, "name": "esync-mean",
                     "folder": str(mode_dir)})
        rows.append({"time_to_target": t})
    (tmp_path / "benchmark.json").write_text(json.dumps({
        "config": {"target": 0.85, "batch_size": 64}, "runs": runs,
        "settings": {"loopback": {"rows": {"esync-mean": rows}}}}))
    assert pace.main([str(tmp_path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "esync-mean" in ln)
    # 30 s at 0.8 s per iteration is 33.75 s at the median 0.9 s; 20 s is 18 s
    assert line == "| esync-mean | loopback | 20.0, 30.0 | 1000.0, 800.0 | 1.50× | 1.88× |"
    assert pace.main([str(tmp_path / "nowhere")]) == 2
    assert "not a benchmark's results" in capsys.readouterr().err


def test_chance_that_repeats_stay_within_a_ratio():
    # Two repeats: ln(t1) - ln(t2) ~ N(0, 2 sigma^2), so P = 2 Phi(ln(r) / (sigma sqrt 2)) - 1.
    w = math.log(1.3) / (0.1 * math.sqrt(2))
    assert stats.chance_within(1.3, 0.1, 2) == pytest.approx(math.erf(w / math.sqrt(2)),
                                                             abs=1e-4)
    # Three repeats of ESync's pooled sigma (0.1): 0.85 (Monte Carlo over 10^6 draws: 0.847).
    assert stats.chance_within(1.3, 0.1, 3) == pytest.approx(0.847, abs=0.003)
    assert stats.chance_within(1.3, 0.1, 5) < stats.chance_within(1.3, 0.1, 3)
    assert stats.chance_within(1.3, 0.001, 3) == pytest.approx(1.0)
    assert stats.chance_within(1.3, 0.2, 3) < 0.4
    # Pooled over reports, each against its own mean: 10 and 20, 30 and 60 are both a factor 2.
    assert stats.pooled_log_sigma([[10, 20], [30, 60], [7]]) == \
        pytest.approx((math.log(2) / math.sqrt(2), 2))
    assert stats.pooled_log_sigma([[7]]) is None


def test_pace_command_pools_a_rows_repeats_over_reports(tmp_path, capsys):
    """Only reports with distinct seeds, and only where every repeat reached the target; one
    device alone once per report although every network setting lists it."""
    def report(name, seeds, rows):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "benchmark.json").write_text(json.dumps({
            "config": {"seeds": seeds}, "runs": [],
            "settings": {setting: {"rows": {row: [None if t is None else {"time_to_target": t}
                                                  for t in times]
                                            for row, times in found.items()}}
                         for setting, found in rows.items()}}))
        return str(folder)
    alone = {"local": [20.0, 21.0, 22.0]}
    folders = [report("a", [1, 2, 3], {"loopback": {"esync-mean": [10.0, 20.0, 10.0], **alone},
                                       "netns": dict(alone)}),
               report("b", [1, 2, 3], {"loopback": {"esync-mean": [30.0, 60.0, None]}}),
               report("c", [1, 1, 1], {"loopback": {"esync-mean": [5.0, 50.0, 5.0]}})]
    assert pace.main(["--pool", *folders, "--min-reports", "1"]) == 0
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")][2:]
    sigma = math.sqrt(2 * (math.log(2) / 3) ** 2 + (2 * math.log(2) / 3) ** 2) / math.sqrt(2)
    chance = stats.chance_within(1.3, sigma, 3)
    assert table == [f"| esync-mean | loopback | 1 | 3 | {sigma:.3f} | 2.00× | 0 of 1 | "
                     f"{chance:.2f} |",
                     "| local | loopback | 1 | 3 | 0.048 | 1.10× | 1 of 1 | 1.00 |"]
    assert pace.main(["--pool", *folders]) == 0                 # seen in one report of three
    assert "no row reached the target in 3 or more of the reports" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        pace.main(folders[:2])
    assert exc.value.code == 2
    assert "give one benchmark folder, or --pool to pool several" in capsys.readouterr().err
    for bad in (["--ratio", "1"], ["--ratio", "nan"], ["--repeats", "1"]):
        with pytest.raises(SystemExit):
            pace.main(["--pool", *folders, *bad])
        assert "--ratio must be above 1" in capsys.readouterr().err
    assert pace.main(["--pool", folders[0], str(tmp_path / "nowhere")]) == 2
    assert "not a benchmark's results" in capsys.readouterr().err


def test_best_other_is_chosen_by_median_not_by_mean():
    # ESync: 10, 11, 100 (mean 40, median 11); ASGD 12 each; SSGD 30 each.
    per_rep = {"esync-mean": metrics_for([10, 11, 100]), "sync": metrics_for([30, 30, 30]),
               "async": metrics_for([12, 12, 12])}
    rows = stats.aggregate(per_rep, horizon=60)
    best = rows["async"]["vs_best_other"]
    assert (best.other, round(best.value, 3)) == ("esync-mean", round(11 / 12, 3))
    assert stats.speedup_cell(best, {"esync-mean": "ESync"}, name_other=True) == \
        "0.92× (over ESync; ranges overlap: not a clear loss)"
    assert stats.speedup_cell(rows["esync-mean"]["vs_sync"]) == \
        "2.73× (ranges overlap: not a clear win)"
    assert rows["sync"]["vs_sync"] is None


def test_aggregates_leave_failed_repeats_out():
    per_rep = {"sync": metrics_for([30, "failed", 34], [0.7, None, 0.9])}
    row = stats.aggregate(per_rep, horizon=60)["sync"]
    assert (row["runs"], row["ok"], row["time"].median, row["accuracy"].median) == (
        3, 2, 32.0, 0.8)


def test_late_accuracy_is_the_mean_of_the_second_half_of_the_checkpoints():
    assert metrics.late_mean(([4, 8, 12, 16], [0.1, 0.2, 0.5, 0.8])) == pytest.approx(0.5)
    assert metrics.late_mean(([3], [0.4])) == 0.4
    assert metrics.late_mean(None) is None and metrics.late_mean(([], [])) is None


def test_by_class_section_bolds_the_best_final_and_second_half_medians(data_dir, tmp_path,
                                                                       full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "esync,async", "--net", "loopback",
                    "--scenarios", "static", "--data", "by-class")
    def reps(finals, lates):
        return [{"time_to_target": None, "final_accuracy": f, "late_accuracy": late}
                for f, late in zip(finals, lates)]
    # ESync ends highest in the median; ASGD's second half is higher in the median
    per_rep = {"esync-sum-share1-accumulate-niid": reps([0.59, 0.57, 0.61], [0.50, 0.53, 0.58]),
               "async-niid": reps([0.48, 0.55, 0.50], [0.54, 0.55, 0.50]),
               "async": reps([0.9] * 3, [0.9] * 3)}
    results = {"loopback": {"rows": stats.aggregate(per_rep, horizon=120)}}
    text = "\n".join(report.by_class_section(args, results, plan.settings(args, RATES),
                                               list(per_rep), {"async-niid": "ASGD"}))
    assert "120 s of training per run" in text
    assert section_row(text, "## By-class data", "esync-sum-share1-accumulate-niid")[1:] == [
        "**0.590 (0.570–0.610)**", "0.530 (0.500–0.580)"]
    assert section_row(text, "## By-class data", "async-niid") == [
        "ASGD (`async-niid`)", "0.500 (0.480–0.550)", "**0.540 (0.500–0.550)**"]
    assert "(`async`)" not in text                  # i.i.d. rows have their own tables
    results["loopback"]["rows"] = stats.aggregate({"async": per_rep["async"]}, horizon=40)
    assert report.by_class_section(args, results, plan.settings(args, RATES), ["async"], {}) == []


def test_table1_bounds_the_speedup_when_ssgd_misses_the_target_within_its_cap():
    def reps(uncut, cut=None):
        return [{"time_to_table1": c, "time_to_table1_uncut": u}
                for u, c in zip(uncut, cut or [None] * len(uncut))]
    per_rep = {"esync-mean": reps([20, 20, 25], [20, 20, 25]),
               "sync": reps([None, None, 110]), "async": reps([None] * 3),
               "sync-niid": reps([5, 5, 5], [5, 5, 5])}
    rows = stats.table1(per_rep, budget=40, sync_cap=120)
    assert [r["name"] for r in rows] == ["sync", "esync-mean", "async"]     # i.i.d., SSGD first
    by = {r["name"]: r for r in rows}
    assert stats.time_cell(by["sync"]["time"], by["sync"]["horizon"]) == \
        "not reached in 120 s (1/3 runs did; fastest 110.0)"
    assert stats.speedup_cell(by["esync-mean"]["vs_sync"]) == "> 6.00×"
    assert by["async"]["vs_sync"] is None
    per_rep["sync"] = reps([60, 70, 80])
    by = {r["name"]: r for r in stats.table1(per_rep, budget=40, sync_cap=120)}
    assert stats.speedup_cell(by["esync-mean"]["vs_sync"]) == "3.50×"
    assert stats.speedup_cell(by["async"]["vs_sync"]) == "< 1.75×"     # 70 s / its 40 s


def test_table1_section_from_hand_made_numbers(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--scenarios", "static", "--net", "loopback",
                    "--sync-cap-seconds", "120")
    per_rep = {"sync": [{"time_to_table1": None, "time_to_table1_uncut": None}] * 3,
               "esync-mean": [{"time_to_table1": t} for t in (20, 22, 30)]}
    results = {"loopback": {"table1": stats.table1(per_rep, budget=40, sync_cap=120)}}
    text = "\n".join(report.table1_section(args, results, plan.settings(args, None),
                                           {"sync": "SSGD", "esync-mean": "ESync (mean)"}))
    assert "| ESync (mean) (`esync-mean`) | 22.0 (20.0–30.0) | > 5.45× |" in text
    assert "| SSGD (`sync`) | not reached in 120 s | — |" in text
    assert ("- loopback: SSGD did not reach 0.80 within 120 s in 3 of 3 run(s) (its median "
            "did not reach it): each speedup is a lower bound") in text


def test_a_longer_run_is_cut_at_its_first_record_at_or_after_the_budget():
    """A run with the budget stops (and checkpoints) at the first round after it; SSGD's longer
    run stands in with its first checkpoint at or after the budget, never fewer records."""
    summary = {"_evaluator": {"elapsed_time_list": [2.0, 3.5, 5.0, 7.0],
                              "accuracy_list": [0.5, 0.7, 0.81, 0.9]}}
    assert metrics.accuracy_until(summary, 4.0) == ([2.0, 3.5, 5.0], [0.5, 0.7, 0.81])
    assert metrics.accuracy_until(summary, 5.0) == ([2.0, 3.5, 5.0], [0.5, 0.7, 0.81])
    assert metrics.accuracy_until(summary, 9.0)[0] == [2.0, 3.5, 5.0, 7.0]
    m = metrics.run_metrics(summary, metrics.physical_limit(None, [1]), standalone=False,
                            target=0.8, horizon=4.0)
    # 0.80 crossed between 0.7 at 3.5 s and 0.81 at 5 s; the checkpoint after it: 5 s
    crossed = 3.5 + 1.5 * 0.1 / 0.11
    assert (m["final_accuracy"], m["time_to_target"], m["time_to_target_uncut"],
            m["time_to_target_checkpoint"], m["cut_s"], m["last_record_s"]) == (
        0.81, pytest.approx(crossed), pytest.approx(crossed), 5.0, 5.0, 7.0)
    m = metrics.run_metrics(summary, metrics.physical_limit(None, [1]), standalone=False,
                            target=0.85, table1_target=0.8, horizon=4.0)
    assert (m["time_to_target"], m["time_to_target_uncut"]) == (
        None, pytest.approx(5.0 + 2.0 * 0.04 / 0.09))
    # Table 1 has its own target (the paper's 0.80), beside the comparisons' 0.85
    assert (m["time_to_table1"], m["time_to_table1_uncut"]) == (
        pytest.approx(crossed), pytest.approx(crossed))
    # The figures end with the runs that kept the budget, not with SSGD's longer ones.
    per_rep = {"sync": [{"horizon": 4.0, "last_record_s": 7.0}],
               "esync": [{"horizon": None, "last_record_s": 4.5}, None]}
    assert report.figure_end(per_rep, ["sync", "esync"]) == 4.5


def test_phase_throughput_splits_the_samples_at_the_switch():
    summary = {"h": {"cpu0": {"elapsed_time_list": [1, 2, 3, 4], "num_samples_list": [10] * 4},
                     "cpu1": {"elapsed_time_list": [2, 4], "num_samples_list": [5, 5]}}}
    assert metrics.phase_throughput(summary, 2.0) == (12.5, 12.5)
    assert metrics.phase_throughput(summary, 3.0) == (35 / 3, 15 / 1)


def test_accuracy_band_is_median_and_min_max_on_the_union_of_record_times():
    from esync.analysis import compare
    grid, mid, low, high = compare.accuracy_band(
        [([1, 3], [0.2, 0.6]), ([1, 2, 3], [0.4, 0.5, 0.9]), ([2, 4], [0.1, 0.3])], xmax=3)
    # From 2 s, where every repeat has begun; each interpolated between its own records.
    assert list(grid) == [2, 3]
    assert [round(v, 6) for v in mid] == [0.4, 0.6]
    assert [round(v, 6) for v in low] == [0.1, 0.2]
    assert [round(v, 6) for v in high] == [0.5, 0.9]
    # A repeat that ended keeps its last accuracy.
    grid, mid, _, _ = compare.accuracy_band([([1, 2], [0.5, 0.6]), ([1, 3], [0.4, 0.8])])
    assert (list(grid), [round(v, 6) for v in mid]) == ([1, 2, 3], [0.45, 0.6, 0.7])


def test_accuracy_figure_draws_the_median_and_a_band(tmp_path):
    from matplotlib.figure import Figure

    from esync.analysis import compare
    summaries = [summary_mod.summarize(logmaker.write_mode(tmp_path / str(i), "sync"))
                 for i in range(2)]
    logmaker.write_evaluations(Path(tmp_path / "1" / logmaker.NETWORK / "sync"),
                               [(2, 2.0, 0.6), (4, 4.0, 0.9)])
    summaries[1] = summary_mod.summarize(tmp_path / "1" / logmaker.NETWORK / "sync")
    fig = Figure()
    assert compare.draw_accuracy_bands(fig, {"sync": summaries}, {"sync": "SSGD"}, title="t",
                                       xmax=4, marks={"slows": 2.0})
    ax = fig.axes[0]
    lines = {ln.get_gid(): list(zip(ln.get_xdata(), ln.get_ydata())) for ln in ax.get_lines()}
    assert [(t, round(a, 6)) for t, a in lines["sync"]] == [(2.0, 0.5), (4.0, 0.8)]
    assert lines["mark-slows"][0][0] == 2.0
    assert [c.get_gid() for c in ax.collections] == ["sync-band"]
    assert ax.get_legend().get_texts()[0].get_text() == "SSGD (median of 2)"


# ----------------------------------------------------------------------------- repeats, scenarios

def test_repeats_use_a_seed_each_and_tuning_runs_once(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--no-niid", "--net",
                    "loopback", "--scenarios", "static", "--seed", "7", "--tune-lr",
                    "0.001,0.003")
    rows = plan.rows(args)
    jobs = plan.full_jobs(args, tmp_path, rows, plan.settings(args, None),
                          {"sync": 0.001, "local": 0.003})
    seeds = {(j.name, j.rep): j.argv[j.argv.index("--seed") + 1] for j in jobs}
    assert seeds == {("sync", 1): "7", ("sync", 2): "8", ("sync", 3): "9",
                     ("local", 1): "7", ("local", 2): "8", ("local", 3): "9"}
    assert len({j.root for j in jobs}) == 6 and len({j.log for j in jobs}) == 6
    tune = plan.tuning_jobs(args, tmp_path, rows)
    assert [(j.name, j.lr, j.argv[j.argv.index("--seed") + 1]) for j in tune] == [
        ("sync", 0.001, "7"), ("sync", 0.003, "7"), ("local", 0.001, "7"),
        ("local", 0.003, "7")]


def test_same_seed_repeats_differ_only_in_their_folders(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "async", "--no-niid", "--net", "loopback",
                    "--scenarios", "static", "--seed", "7", "--tune-lr", "none",
                    "--same-seed")
    jobs = plan.full_jobs(args, tmp_path, plan.rows(args), plan.settings(args, None),
                          {"async": 0.001})
    assert [(j.rep, j.argv[j.argv.index("--seed") + 1]) for j in jobs] == [
        (1, "7"), (2, "7"), (3, "7")]
    assert len({j.root for j in jobs}) == 3
    assert [(a.replace(str(j.root), "ROOT")) for j in jobs[1:] for a in j.argv] == [
        a.replace(str(jobs[0].root), "ROOT") for _ in jobs[1:] for a in jobs[0].argv]
    assert "--same-seed" in options.canonical_command(args).split()


def test_ssgd_runs_on_to_the_target_or_its_cap_in_the_static_iid_rows(data_dir, tmp_path,
                                                                        full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,async", "--repeats", "1",
                    "--sync-cap-seconds", "150")
    jobs = plan.full_jobs(args, tmp_path, plan.rows(args), plan.settings(args, RATES),
                          {"sync": 0.001, "async": 0.001, "sync-niid": 0.001,
                           "async-niid": 0.001})
    extended = {(j.setting.name, j.name) for j in jobs if j.extended}
    assert extended == {("loopback", "sync"), ("netns", "sync")}
    for job in jobs:
        argv = job.argv
        budget = argv[argv.index("--max-seconds") + 1]
        if job.extended:
            # until both targets: the comparisons' 0.85 and Table 1's 0.80
            assert (budget, argv[argv.index("--target-accuracy") + 1]) == ("150.0", "0.85")
        else:       # by-class rows: --byclass-budget, by default 3 x --budget
            assert budget == ("120.0" if job.row.split else "40.0")
            assert "--target-accuracy" not in argv


def test_shifting_rows_slow_the_second_fast_device_after_a_quarter_of_the_budget(
        data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--budget", "60", "--repeats", "1", "--no-niid")
    rows = plan.rows(args)
    shifting = [r for r in rows if r.scenario == "shifting"]
    assert [(r.name, r.group) for r in shifting] == [
        ("esync-weighted-nesterov0.9-gl0.7-share1-carry-dynamic",
         "esync-weighted-nesterov0.9-gl0.7-share1-carry"),
        ("esync-weighted-nesterov0.9-gl0.7-share1-carry-planned",
         "esync-weighted-nesterov0.9-gl0.7-share1-carry"),
        ("sync", "sync"), ("async", "async")]
    lrs = {r.group: 0.001 * (i + 1) for i, r in enumerate(rows)}
    jobs = [j for j in plan.full_jobs(args, tmp_path, rows, plan.settings(args, RATES), lrs)
            if j.setting.name == "shifting"]
    assert [j.name for j in jobs] == [r.name for r in shifting]
    for job in jobs:
        argv = job.argv
        assert argv[argv.index("--speed-schedule") + 1] == "cpu1:1@0,6@15"
        assert job.budget == 60 and not job.extended and "--net" not in argv
        assert argv[argv.index(job.row.lr_flag) + 1] == repr(lrs[job.row.group])
    policies = [j.argv[j.argv.index("--policy") + 1] for j in jobs[:2]]
    assert policies == ["dynamic", "planned"]
    static = [j for j in plan.full_jobs(args, tmp_path, rows, plan.settings(args, RATES), lrs)
              if j.setting.name != "shifting"]
    assert static and all("--speed-schedule" not in j.argv for j in static)
    # Tuning runs once per group: the shifting rows add none.
    assert len(plan.tuning_jobs(args, tmp_path, rows)) == 3 * 6


def test_shifting_schedule_follows_the_factors(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--workers", "3", "--slowdown", "2,4,3", "--budget",
                    "30")
    assert plan.shift_schedule(args) == ("cpu2", "cpu2:3@0,18@7.5", 7.5)   # a quarter
    args = args_for(data_dir, tmp_path, "--workers", "3", "--slowdown", "2,4,3", "--budget",
                    "30", "--shift-at", "12")
    assert plan.shift_schedule(args) == ("cpu2", "cpu2:3@0,18@12", 12.0)
    assert "--shift-at 12" in options.canonical_command(args)


def test_a_shift_after_the_budget_is_refused(data_dir, tmp_path, full_launcher):
    with pytest.raises(options.UsageError,
                       match=r"--shift-at: 40 s is not before the end of training \(--budget 40\)"):
        args_for(data_dir, tmp_path, "--shift-at", "40")


def test_shifting_is_left_out_where_the_launcher_cannot(data_dir, tmp_path, old_launcher):
    args = args_for(data_dir, tmp_path)
    assert args.scenario_list == ["static"]
    assert args.scenario_notice == ("shifting scenario left out: this checkout's esync-cluster "
                                    "has no --speed-schedule option")
    assert all(r.scenario == "static" for r in plan.rows(args))
    with pytest.raises(options.UsageError, match="--scenarios shifting: this checkout's"):
        args_for(data_dir, tmp_path, "--scenarios", "shifting")


def test_scenarios_option(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--scenarios", "shifting", "--modes", "esync,local")
    assert {r.scenario for r in plan.rows(args)} == {"shifting"}
    assert [s.name for s in plan.settings(args, RATES)] == ["shifting"]
    assert "--scenarios shifting" in options.canonical_command(args)
    with pytest.raises(options.UsageError, match="--scenarios: 'static,windy' is not"):
        args_for(data_dir, tmp_path, "--scenarios", "static,windy")


# ----------------------------------------------------------------------------- emulation

def test_emulation_flags_reach_the_cluster_runs_only(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--no-niid", "--net",
                    "loopback", "--cpu-share", "0.5", "--repeats", "1")
    jobs = plan.full_jobs(args, tmp_path, plan.rows(args), plan.settings(args, None),
                          {"sync": 0.001, "local": 0.001})
    by = {j.name: j.argv for j in jobs}
    assert by["sync"][by["sync"].index("--emulation"):][:4] == [
        "--emulation", "auto", "--cpu-share", "0.5"]
    assert "--emulation" not in by["local"] and "--cpu-share" not in by["local"]
    assert "--emulation auto --cpu-share 0.5" in options.canonical_command(args)


def test_an_older_launcher_gets_no_emulation_flags(data_dir, tmp_path, old_launcher):
    args = args_for(data_dir, tmp_path)
    assert args.emulation_argv == [] and not args.launcher_emulation
    for flag in (("--emulation", "cpu-cap"), ("--cpu-share", "0.5")):
        with pytest.raises(options.UsageError, match="has no --emulation option"):
            args_for(data_dir, tmp_path, *flag)


def test_cpu_cap_asked_for_where_impossible_names_why(data_dir, tmp_path, full_launcher,
                                                      monkeypatch):
    monkeypatch.setattr(emulation, "cgroups_unavailable", lambda: "no cpu controller here")
    with pytest.raises(options.UsageError,
                       match="--emulation cpu-cap: no cpu controller here; use --emulation"):
        args_for(data_dir, tmp_path, "--emulation", "cpu-cap")


class FakeCgroups:
    """esync.emulation.cgroups's API, recording what the benchmark asks of it."""
    ONE_COMPUTE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

    class CgroupsUnavailable(Exception):
        pass

    def __init__(self, available=True):
        self.available, self.calls = available, []

    def default_share(self, factors, cores, reserve=0.5):
        self.calls.append(("default_share", list(factors), cores))
        return round((cores - reserve) / sum(1 / f for f in factors), 4)

    def CpuCaps(self):
        if not self.available:
            raise self.CgroupsUnavailable("CPU caps unavailable: not root")
        fake = self

        class Caps:
            def cap(self, device, cores):
                fake.calls.append(("cap", device, cores))
                return f"/cgroup/{device}"

            def exec_prefix(self, device):
                return ["/bin/sh", "-c", "in-group", device]

            def close(self):
                fake.calls.append(("close",))
        return Caps()


def standalone_jobs(args, tmp_path):
    return plan.full_jobs(args, tmp_path, plan.rows(args), plan.settings(args, None),
                          {"sync": 0.001, "local": 0.001})


def test_standalone_runs_under_the_x1_devices_cap(data_dir, tmp_path, full_launcher,
                                                  monkeypatch):
    fake = FakeCgroups()
    monkeypatch.setattr(emulation, "_cgroups", lambda: (fake, None))
    monkeypatch.setattr(emulation, "cores_here", lambda: 2)
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--no-niid", "--net",
                    "loopback", "--repeats", "1")
    jobs = standalone_jobs(args, tmp_path)
    with emulation.StandaloneCap(args) as cap:
        cap.apply(jobs)
    by = {j.name: j for j in jobs}
    share = round(1.5 / (1 + 1 + 1 / 4 + 1 / 8), 4)                  # 0.6316
    assert fake.calls == [("default_share", [1.0, 1.0, 4.0, 8.0], 2),
                          ("cap", "standalone", share), ("close",)]
    assert by["local"].prefix == []        # it joins its group when training starts
    env = plan.child_env(by["local"])
    assert (env["OMP_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]) == ("1", "1")
    assert env["ESYNC_CPU_CGROUP"] == "/cgroup/standalone"
    first = min(os.sched_getaffinity(0))        # on one CPU, as the launcher's capped devices
    assert env["ESYNC_CPU_PIN"] == str(first)
    assert by["sync"].prefix == [] and "OPENBLAS_NUM_THREADS" not in by["sync"].env
    assert cap.info == {"capped": True, "share": share, "reason": None, "cpu": first,
                        "env": {**FakeCgroups.ONE_COMPUTE_THREAD_ENV,
                                "ESYNC_CPU_CGROUP": "/cgroup/standalone",
                                "ESYNC_CPU_PIN": str(first)}}


def test_without_pinning_the_standalone_run_moves_between_cores_as_the_devices_do(
        data_dir, tmp_path, full_launcher, monkeypatch):
    fake = FakeCgroups()
    monkeypatch.setattr(emulation, "_cgroups", lambda: (fake, None))
    monkeypatch.setattr(emulation, "cores_here", lambda: 2)
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--no-niid", "--net",
                    "loopback", "--repeats", "1", "--no-cpu-pinning")
    assert args.emulation_argv[-1] == "--no-cpu-pinning"      # passed to every cluster run
    jobs = standalone_jobs(args, tmp_path)
    with emulation.StandaloneCap(args) as cap:
        cap.apply(jobs)
    assert "ESYNC_CPU_PIN" not in plan.child_env(next(j for j in jobs if j.standalone))
    assert cap.info["cpu"] is None


def test_the_given_cpu_share_caps_the_standalone_run(data_dir, tmp_path, full_launcher,
                                                     monkeypatch):
    fake = FakeCgroups()
    monkeypatch.setattr(emulation, "_cgroups", lambda: (fake, None))
    args = args_for(data_dir, tmp_path, "--modes", "local", "--net", "loopback",
                    "--no-niid", "--cpu-share", "0.4")
    with emulation.StandaloneCap(args) as cap:
        pass
    assert ("cap", "standalone", 0.4) in fake.calls and cap.share == 0.4


@pytest.mark.parametrize("launcher, flags, available, reason", [
    ("full", ("--emulation", "sleep"), True, "--emulation sleep"),
    ("full", (), False, "CPU caps unavailable: CPU caps unavailable: not root"),
    ("old", (), True, "the launcher has no --emulation option")])
def test_standalone_falls_back_to_a_whole_core_and_says_why(
        data_dir, tmp_path, monkeypatch, launcher, flags, available, reason):
    monkeypatch.setattr(options, "launcher_flags",
                        lambda: FLAGS if launcher == "full" else OLD_FLAGS)
    monkeypatch.setattr(options, "netns_possible", lambda flags: None)
    fake = FakeCgroups(available)
    monkeypatch.setattr(emulation, "_cgroups", lambda: (fake, None))
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--no-niid", "--net",
                    "loopback", *flags)
    jobs = standalone_jobs(args, tmp_path)
    with emulation.StandaloneCap(args) as cap:
        cap.apply(jobs)
    assert cap.share is None and cap.info["reason"].startswith(reason)
    assert all(j.prefix == [] for j in jobs)


def test_a_missing_cgroups_module_means_no_caps(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_cgroups(name, *a, **k):
        if name == "esync.emulation.cgroups":
            raise ImportError("No module named 'esync.emulation.cgroups'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_cgroups)
    assert "no usable esync.emulation.cgroups" in emulation.cgroups_unavailable()


def test_run_job_starts_the_program_behind_its_prefix(tmp_path):
    row = plan.Row(name="local", label="Standalone SGD", mode="local", split=0, group="local")
    job = plan.Job(row=row, setting=plan.LOOPBACK, rep=1, lr=0.1, root=tmp_path,
                   folder=tmp_path / "none", argv=["from", "the", "program"],
                   log=tmp_path / "out.log", budget=1, prefix=["/bin/echo", "prefixed"])
    runs.run_job(job, runs.Progress(1, stream=open(os.devnull, "w")))
    assert job.returncode == 0
    assert job.log.read_text().splitlines()[-1] == "prefixed from the program"


def write_cluster_json(folder, **info):
    folder.mkdir(parents=True, exist_ok=True)
    runlayout.cluster_file(folder).write_text(json.dumps(info))


def survey_of(tmp_path, infos):
    jobs = []
    for i, info in enumerate(infos):
        row = plan.Row(name="sync", label="SSGD", mode="sync", split=0, group="sync")
        folder = tmp_path / f"run{i}"
        if info is not None:
            write_cluster_json(folder, **info)
        jobs.append(plan.Job(row=row, setting=plan.LOOPBACK, rep=1, lr=0.1, root=folder,
                             folder=folder, argv=[], log=folder / "log", budget=1,
                             returncode=0))
    return emulation.survey(jobs)


PLACEMENT = [{"device": "cpu0", "host": "h", "shard": 0, "classes": None, "slowdown": 1.0,
              "cpu_cores": 0.63}, {"device": "cpu1", "host": "h", "shard": 1,
                                   "classes": None, "slowdown": 4.0, "cpu_cores": 0.1575}]


def test_emulation_is_read_from_each_runs_cluster_json(tmp_path):
    seen = survey_of(tmp_path, [{"emulation": "cpu-cap", "cpu_share": 0.63,
                                 "placement": PLACEMENT}] * 2)
    lines = emulation.describe(seen, {"capped": True, "share": 0.63})
    assert lines[0] == ("- emulation: **cpu-cap** in every cluster run; share S = 0.63 core "
                        "per ×1 device (a ×F device gets S/F) (read from each run's "
                        "cluster.json)")
    assert lines[1].startswith("- standalone SGD: capped at 0.63 core")
    assert lines[2] == "- placement (first full run): cpu0 ×1: 0.63 core, cpu1 ×4: 0.1575 core"
    assert not any("mismatch" in ln for ln in lines)
    fine = survey_of(tmp_path / "fine", [{"emulation": "cpu-cap", "cpu_share": 0.63,
                                          "cfs_slice_us": 1000}])
    assert emulation.describe(fine, {"capped": True, "share": 0.63})[0] == (
        "- emulation: **cpu-cap** in every cluster run; share S = 0.63 core per ×1 device (a ×F "
        "device gets S/F); CFS bandwidth slice 1 ms (a cap's period holds at least one) (read "
        "from each run's cluster.json)")


def test_emulation_mismatches_are_named(tmp_path):
    capped = survey_of(tmp_path / "a", [{"emulation": "cpu-cap", "cpu_share": 0.5}, None])
    lines = emulation.describe(capped, {"capped": False, "reason": "not root"})
    assert lines[0].startswith("- emulation: **mixed**: ")
    assert "cpu-cap in 1 run(s)" in lines[0] and "sleep (older launcher) in 1 run(s)" in lines[0]
    assert any("**mismatch**: the cluster ran capped but the standalone run did not" in ln
               for ln in lines)
    other = emulation.describe(survey_of(tmp_path / "b", [{"emulation": "cpu-cap",
                                                           "cpu_share": 0.5}]),
                               {"capped": True, "share": 0.63})
    assert any("differs from the standalone run's (0.63)" in ln for ln in other)


# ----------------------------------------------------------------------------- the estimate

def test_estimate_is_the_budgets_plus_the_measured_overhead(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--no-niid", "--repeats", "2",
                    "--scenarios", "static", "--tune-lr", "0.001")
    rows = plan.rows(args)
    jobs = plan.tuning_jobs(args, tmp_path, rows) + plan.full_jobs(
        args, tmp_path, rows, plan.settings(args, RATES), {"sync": 0.001, "local": 0.001})
    # tuning: sync 10 + its overhead, local 10 + (fixed + share x 10); per repeat: sync on
    # loopback and on netns 100 (SSGD's cap: 2.5 x 40) + overhead, local 40 + (fixed + share x 40).
    over, (fixed, share) = plan.OVERHEAD_S, plan.STANDALONE_OVERHEAD_S
    tuning = (10 + over["tune"]) + (10 + fixed + share * 10)
    per_repeat = (100 + over["loopback"]) + (100 + over["netns"]) + (40 + fixed + share * 40)
    expected = tuning + 2 * per_repeat + plan.FIXED_OVERHEAD_S
    assert plan.estimate(jobs)["total_s"] == pytest.approx(expected)


def test_the_default_benchmark_fits_in_100_minutes_on_2_cores(data_dir, tmp_path,
                                                              full_launcher, monkeypatch):
    import esync.common.collectives as collectives
    monkeypatch.setattr(collectives, "horovod_missing", lambda: None)     # its rows run
    args = benchmark.parse_args(["-dd", str(data_dir), "--out", str(tmp_path / "o")])
    rows = plan.rows(args)
    settings = plan.settings(args, RATES)
    jobs = plan.tuning_jobs(args, tmp_path, rows) + plan.planned_confirmations(
        args, tmp_path, rows) + plan.full_jobs(
        args, tmp_path, rows, settings, {r.group: 0.001 for r in rows})
    per_repeat = [(j.setting.name, j.name) for j in jobs if j.rep == 1]
    assert {"sync-fast", "async-fast", "sync-allreduce", "sync-allreduce-fast"} <= {
        name for _, name in per_repeat}
    assert len(per_repeat) == 23 and {s.name for s in settings} == {"loopback", "netns",
                                                                     "shifting"}
    # 8 i.i.d. rows x 3 rates, every one but ESync's two at momentum 0 and 0.9 (by-class rows
    # left the default to make room), then each row's 2 best pairs again with the next seed,
    # one device alone's with the next two
    assert len([j for j in jobs if j.tuning]) == (2 + 6 * 2) * 3 + 7 * 2 + 2 * 2
    assert args.repeats == 3 and args.splits == [0]
    estimate = plan.estimate(jobs)["total_s"]
    # with the overheads of the slower machine, and room for what the plan cannot know: a
    # widening or two (6 min in that machine's run; the afternoon run of 2026-11-28 took 93.8
    # min with 4 widening runs, estimated at 94 without)
    assert estimate + 5.5 * 60 <= 100 * 60, estimate / 60


def test_dry_run_prints_the_plan_and_the_estimate(data_dir, tmp_path, full_launcher, capsys):
    out = tmp_path / "dry"
    assert benchmark.main(["-dd", str(data_dir), "--out", str(out), *RATES_ONLY, "--dry-run",
                           "--modes",
                           "sync", "--no-niid", "--net", "loopback", "--tune-lr", "none",
                           "--repeats", "2", "--scenarios", "static"]) == 0
    text = capsys.readouterr().out
    assert ("plan: 2 full run(s): 2 repeat(s) (seeds 1, 2) × 1 (loopback 1) of 40 s; SSGD's 1 "
            "i.i.d. run(s) per repeat until 0.85 or 100 s") in text
    minutes = (2 * (100 + plan.OVERHEAD_S["loopback"]) + plan.FIXED_OVERHEAD_S) / 60
    assert f"estimated time: {minutes:.0f} min" in text
    assert "[rep 2 loopback sync] python -m esync.launch -m sync" in text and not out.exists()


def test_link_metrics_take_the_busiest_worker_host_and_the_server_per_round():
    links = {"hosts": {"ps": {"sent": 900, "received": 300},
                       "host0": {"sent": 400, "received": 600},
                       "host1": {"sent": 500, "received": 100}},
             "worker_hosts": ["host0", "host1"], "ps_host": "ps"}
    assert metrics.link_metrics(links, 10) == {"worker_link_bytes_per_round": 60.0,
                                               "server_link_bytes_per_round": 90.0}
    assert metrics.link_metrics(None, 10)["worker_link_bytes_per_round"] is None


def test_collective_section_pairs_each_row_with_its_allreduce_twin(tmp_path):
    import types
    from esync.benchmark import report, stats
    from esync.benchmark.plan import LOOPBACK

    def row(time, server=None, exchange=None, link=None):
        return {"ok": 3, "time": stats.spread([time] * 3, censored=True),
                "accuracy": stats.spread([0.85, 0.86, 0.87]),
                "server_bytes_per_round": server, "exchange_bytes": exchange,
                "worker_link_bytes_per_round": link, "server_link_bytes_per_round": None}
    results = {"loopback": {"names": ["sync", "sync-allreduce", "async", "sync-fast",
                                      "sync-allreduce-fast"],
                            "rows": {"sync": row(30.0, server=8e6, exchange=2e6),
                                     "sync-allreduce": row(20.0, exchange=3e6, link=3.2e6),
                                     "async": row(25.0),
                                     "sync-fast": row(22.0, server=4e6, exchange=2e6),
                                     "sync-allreduce-fast": row(21.0, exchange=2e6)}}}
    args = types.SimpleNamespace(workers=4, target=0.85, fast_list=[0, 1])
    text = "\n".join(report.collective_section(args, results, [LOOPBACK], {}))
    lines = [line for line in text.splitlines() if line.startswith("| loopback")]
    assert len(lines) == 2 and "8.00" in lines[0] and "3.00 (3.20)" in lines[0]
    # measured over the model, then the ring's 2(N-1)/N for the row's own N: 4, then 2
    assert lines[0].rstrip(" |").endswith("1.60 (1.50)")
    assert lines[1].rstrip(" |").endswith("1.00 (counted) (1.00)")


def test_the_canonical_command_gives_back_every_aggregation_part():
    from esync.benchmark.options import _aggregation_text
    text = ("fednova+scaffold,fednova+prox=0.1,weighted+nesterov=0.9+gl=0.7+share=0.1+overlap,"
            "mean+momentum=0.5,weighted+nesterov=0.9+gl=0.7+overlap+fp16,"
            "weighted+nesterov=0.9+gl=0.7+share=1+lowrank=32,sum+adam=0.9+gl=0.01")
    parsed = options.parse_aggregations(text)
    assert options.parse_aggregations(",".join(_aggregation_text(a) for a in parsed)) == parsed
    assert ",".join(_aggregation_text(a) for a in parsed) == text
