"""esync-benchmark: options, the plan of runs, tuning, the report on synthetic logs, and short
real runs (a local cluster for esync and sync plus standalone SGD; a tuning grid on standalone
SGD) whose report is checked against the logs. No wall-clock time is asserted."""
import csv
import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from support import write_fashion_dir
from esync import benchmark
from esync.analysis import summary as summary_mod
from esync.benchmark import metrics, options, plan, report, shaping

sys.path.insert(0, str(Path(__file__).resolve().parent / "analysis"))
import logmaker  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "benchmark.py"
ROWS = ("esync-mean", "sync", "local")
SLOWDOWNS = (1.0, 2.0)
FLAGS = {"--aggregation", "--outer-momentum", "--nesterov", "--net", "--bandwidth",
         "--server-bandwidth", "--hosts"}


def run_script(*args, timeout=900):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=str(REPO),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    # Learnable stand-in for Fashion-MNIST (one bright bar per class): accuracy rises in seconds.
    return write_fashion_dir(tmp_path_factory.mktemp("bench") / "data", train_per_class=100,
                             test_per_class=30)


@pytest.fixture
def full_launcher(monkeypatch):
    """A launcher with the aggregation and namespace options, and namespaces possible."""
    monkeypatch.setattr(options, "launcher_flags", lambda: FLAGS)
    monkeypatch.setattr(options, "netns_possible", lambda flags: None)


def args_for(data_dir, tmp_path, *extra):
    return benchmark.parse_args(["-dd", str(data_dir), "--out", str(tmp_path / "o"), *extra])


# ----------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def bench(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out") / "report"
    proc = run_script("--workers", 2, "--slowdown", "1,2", "--budget", 8,
                      "--modes", "esync,sync,local", "--aggregations", "mean", "--target", 0.5,
                      "--tune-lr", "none", "--no-niid", "--net", "loopback",
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
    ev = summary["_evaluator"]
    hits = sorted(t for t, a in zip(ev["elapsed_time_list"], ev["accuracy_list"]) if a >= target)
    return hits[0] if hits else None


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
    limit = min(sum(local_tp / f for f in SLOWDOWNS), 2 * local_tp)   # this machine: 2 cores
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


def test_speedup_table_csv_has_one_row_per_row_name(bench):
    with open(bench[1] / "tables" / "loopback" / "speedup.csv", newline="") as fp:
        rows = {r["mode"]: r for r in csv.DictReader(fp)}
    assert sorted(rows) == sorted(ROWS) and rows["esync-mean"]["label"] == "ESync (mean)"


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
                      "--budget", 3, "--net", "loopback", "--target", 0.5, "-dd", data_dir,
                      "--out", out, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "benchmark.json").read_text())
    scores = data["tuning"]["local"]["scores"]
    best = max(scores, key=lambda lr: scores[lr])
    full = [r for r in data["runs"] if r["rep"] == 1]
    assert [r["lr"] for r in full] == [float(best)] and len(data["runs"]) == 3


def test_a_failing_run_is_reported_and_the_others_still_run(data_dir, tmp_path):
    out = tmp_path / "out"
    # A job timeout shorter than start-up: each run is stopped and reported as failed.
    proc = run_script("--workers", 2, "--slowdown", "1,2", "--budget", 8, "--modes",
                      "sync,local", "--job-timeout", 2, "--tune-lr", "none", "--no-niid",
                      "--net", "loopback", "-dd", data_dir, "--out", out, timeout=300)
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
                                "--nesterov", "-gl", "0.7"]


def test_default_target_and_grid(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path)
    assert (args.target, args.lr_grid) == (0.85, [0.0003, 0.001, 0.003])


# ----------------------------------------------------------------------------- planning

def test_rows_per_aggregation_rule_and_split(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "esync,sync,local",
                    "--aggregations", "mean,weighted+nesterov=0.9")
    assert [(r.name, r.label) for r in plan.rows(args)] == [
        ("esync-mean", "ESync (mean)"),
        ("esync-weighted-nesterov0.9", "ESync (weighted + Nesterov 0.9)"),
        ("sync", "SSGD"), ("local", "Standalone SGD"),
        ("esync-mean-niid", "ESync (mean) (non-i.i.d.)"),
        ("esync-weighted-nesterov0.9-niid", "ESync (weighted + Nesterov 0.9) (non-i.i.d.)"),
        ("sync-niid", "SSGD (non-i.i.d.)")]


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
    args = args_for(data_dir, tmp_path, "--modes", "sync", "--hosts", "1,1,2", "--no-niid")
    settings = plan.settings(args, RATES)
    jobs = plan.full_jobs(args, tmp_path, plan.rows(args), settings, {"sync": 0.001})
    assert [j.setting.name for j in jobs] == ["loopback", "netns"]
    assert "--net" not in jobs[0].argv
    assert jobs[1].argv[-9:] == ["--net", "netns", "--bandwidth", "150mbit",
                                 "--server-bandwidth", "150mbit", "--hosts", "1,1,2", "--quiet"]


def test_standalone_and_by_class_rows_run_in_the_first_setting_only(data_dir, tmp_path,
                                                                    full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--repeats", "2")
    jobs = plan.full_jobs(args, tmp_path, plan.rows(args), plan.settings(args, RATES),
                          {"sync": 0.001, "local": 0.001, "sync-niid": 0.0003})
    rep1 = [(j.setting.name, j.name) for j in jobs if j.rep == 1]
    assert rep1 == [("loopback", "sync"), ("loopback", "local"), ("loopback", "sync-niid"),
                    ("netns", "sync")]
    assert len(jobs) == 8


def test_tuning_runs_each_row_on_its_own_data_with_each_value(data_dir, tmp_path,
                                                                full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "async,dcasgd", "--tune-lr", "0.01,0.001",
                    "--tune-budget", "5")
    jobs = plan.tuning_jobs(args, tmp_path, plan.rows(args), plan.settings(args, RATES)[0])
    assert [(j.row.group, j.lr, j.budget) for j in jobs] == [
        ("async", 0.001, 5.0), ("async", 0.01, 5.0), ("dcasgd", 0.001, 5.0),
        ("dcasgd", 0.01, 5.0), ("async-niid", 0.001, 5.0), ("async-niid", 0.01, 5.0),
        ("dcasgd-niid", 0.001, 5.0), ("dcasgd-niid", 0.01, 5.0)]
    assert jobs[2].argv[jobs[2].argv.index("-dcasgd") + 1] == "1"
    assert "-s" not in jobs[0].argv and jobs[4].argv[jobs[4].argv.index("-s") + 1] == "1"
    full = plan.full_jobs(args, tmp_path, plan.rows(args), plan.settings(args, RATES)[:1],
                          {"async": 0.01, "dcasgd": 0.01, "async-niid": 0.001,
                           "dcasgd-niid": 0.001})
    assert {j.name: j.lr for j in full} == {"async": 0.01, "dcasgd": 0.01, "async-niid": 0.001,
                                            "dcasgd-niid": 0.001}


@pytest.mark.parametrize("flags, splits", [
    ((), [0, 1]), (("--data", "iid"), [0]), (("--data", "by-class"), [1]),
    (("--no-niid",), [0]), (("--niid",), [0, 1]), (("--data", "iid", "--no-niid"), [0]),
    (("--data", "by-class-shuffled"), [2]), (("--data", "iid,by-class-shuffled"), [0, 2])])
def test_data_option_picks_the_splits(data_dir, tmp_path, full_launcher, flags, splits):
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", *flags)
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

def synthetic_job(tmp_path, group, lr, accuracy_shift, *, mode="sync", ok=True):
    row = plan.Row(name=group, label=group, mode=mode, split=0, group=group)
    job = plan.Job(row=row, setting=plan.Setting("loopback", "loopback"), rep=0, lr=lr,
                   root=tmp_path, folder=tmp_path, argv=[], log=tmp_path / "x.log", budget=1)
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


def test_ties_go_to_the_smaller_rate(tmp_path):
    jobs = [synthetic_job(tmp_path, "sync", lr, 0.0) for lr in (0.01, 0.001)]
    assert metrics.best_learning_rates(jobs)["sync"]["lr"] == 0.001


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


def test_matching_rate_for_lenet_at_20_ms():
    # 8 x 1,724,320 B / ((374 / 60) x 20 ms) = 111 Mbit/s
    bit_s = shaping.matching_rate_bit_s(1_724_320, 0.020)
    assert (round(bit_s / 1e6), shaping.tc_rate(bit_s)) == (111, "111mbit")


@pytest.mark.parametrize("text, bit_s", [("100mbit", 1e8), ("2gbit", 2e9), ("500kbit", 5e5),
                                          ("10mbps", 8e7)])
def test_tc_rates_read_back(text, bit_s):
    assert shaping.rate_bit_s(text) == bit_s


def test_cells_give_mean_and_std_over_repeats():
    assert benchmark._cell([2.0, 4.0, None], ".1f") == "3.0 ± 1.4"
    assert benchmark._cell([None], ".2f") == "n/a"


# ----------------------------------------------------------------------------- report

@pytest.fixture
def synthetic_report(data_dir, tmp_path, full_launcher):
    """report.render over logmaker's logs: esync (mean), sync, local; two settings, where ESync
    is 1 s faster on the shaped links (its logs shifted by -1 s)."""
    args = args_for(data_dir, tmp_path, "--modes", "esync,sync,local", "--aggregations", "mean",
                    "--no-niid", "--tune-lr", "0.001,0.003")
    out = Path(args.out)
    rows = {r.name: r for r in plan.rows(args)}
    settings = plan.settings(args, RATES)
    jobs = []
    for setting in settings:
        for name, row in rows.items():
            if setting.name == "netns" and name == "local":
                continue
            root = out / setting.name / name
            mode_dir = logmaker.write_mode(root, row.mode if row.mode != "esync" else "esync")
            if setting.name == "netns" and row.mode == "esync":
                logmaker.write_evaluations(mode_dir, [(r, t - 1, a) for r, t, a
                                                      in logmaker.EVALUATIONS["esync"]])
            job = plan.Job(row=row, setting=setting, rep=1, lr=0.001, root=root,
                           folder=mode_dir, argv=["python", "-m", "esync.launch"],
                           log=out / "runs" / f"{setting.name}-{name}.log", budget=1)
            job.summary = summary_mod.summarize(mode_dir)
            jobs.append(job)
    tune = [synthetic_job(tmp_path, "sync", lr, s) for lr, s in ((0.001, -0.3), (0.003, 0))]
    results = metrics.results(args, jobs, [s.name for s in settings])
    labels = {r.name: r.label for r in rows.values()}
    shaping_info = {"reference": shaping.REFERENCE, "ratio": shaping.RATIO,
                    "measured": {"model_bytes": 1_724_320, "compute_s": 0.02},
                    "derived_bit_s": shaping.matching_rate_bit_s(1_724_320, 0.02),
                    "derived": "111mbit", "worker": ["111mbit"], "server": "111mbit",
                    "auto": True}
    text = report.render(args, jobs=jobs, tune_jobs=[], results=results, settings=settings,
                         names=list(rows), labels=labels,
                         tuning=metrics.best_learning_rates(tune), shaping=shaping_info,
                         written=[], problems=[], command="esync-benchmark",
                         started=datetime(2026, 1, 1), seconds=60)
    return text


def side_by_side_row(text, name):
    section = text.split("## Results side by side")[1].split("\n## ")[0]
    line = next(ln for ln in section.splitlines() if f"(`{name}`)" in ln)
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_report_shows_both_settings_side_by_side(synthetic_report):
    # logmaker: esync reaches 0.85 at 3 s (2 s shaped), sync never; local at 0.875 s.
    assert side_by_side_row(synthetic_report, "esync-mean")[1:] == [
        "3.0", "n/a", "0.29× (over Standalone SGD)", "0.860",
        "2.0", "n/a", "0.44× (over Standalone SGD)", "0.860"]


def test_report_gives_the_grid_with_the_chosen_rate_in_bold(synthetic_report):
    line = next(ln for ln in synthetic_report.splitlines() if ln.startswith("| SSGD (`sync`)")
                and "**" in ln)
    assert line == f"| SSGD (`sync`) | {0.84 - 0.3:.3f} | **0.840** | 0.003 |"


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
