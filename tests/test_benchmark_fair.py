"""esync-benchmark's fair comparison: every baseline row tuned over the same rate x momentum
grid, the rows of the alternatives a user would pick (SSGD and ASGD on the fast devices alone,
Horovod's SSGD), "vs best other" over all of them, the lead picture and the zoomed accuracy
axis, and bad input refused before anything runs. Plans, hand-made numbers and dry runs: no
cluster starts here."""
import numpy as np
import pytest
from matplotlib.figure import Figure

from esync import benchmark
from esync.analysis import compare
from esync.benchmark import options, plan, report, stats

FLAGS = {"--aggregation", "--outer-momentum", "--nesterov", "--net", "--bandwidth",
         "--server-bandwidth", "--hosts", "--emulation", "--cpu-share", "--speed-schedule",
         "--collective", "--no-cpu-pinning"}
RATES = {"worker": ["150mbit"], "server": "150mbit"}


@pytest.fixture
def data_dir(fashion_data_dir):
    """Only its files' presence matters here: nothing trains."""
    return fashion_data_dir


@pytest.fixture
def full_launcher(monkeypatch):
    """A launcher with every option the benchmark passes, namespaces possible, Horovod
    installed (the fast-devices rows' CPU share is what the plan computes here)."""
    monkeypatch.setattr(options, "launcher_flags", lambda: FLAGS)
    monkeypatch.setattr(options, "netns_possible", lambda flags: None)
    import esync.common.collectives as collectives
    monkeypatch.setattr(collectives, "horovod_missing", lambda: None)


def args_for(data_dir, tmp_path, *extra):
    return benchmark.parse_args(["-dd", str(data_dir), "--out", str(tmp_path / "o"), *extra])


def value_after(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("argv, message", [
    (["--tune-momentum", "1"], "every momentum must be in [0, 1)"),
    (["--tune-momentum", "0,-0.5"], "every momentum must be in [0, 1)"),
    (["--tune-momentum", "0,x"], "is not a comma-separated list of momenta, e.g. 0,0.9"),
    (["--aggregations", "weighted+nesterov=1"], "a momentum M in [0, 1)"),
    (["--fast-devices", "7"], "'7' names no device of this cluster (cpu0-cpu3, from "
                              "--workers 4); give indices or names such as 0,1"),
    (["--fast-devices", "gpu0"], "'gpu0' names no device"),
    (["--fast-devices", ","], "',' names no device"),
    (["--fast-devices", "0,1,cpu2,3"], "names every device, which is the whole cluster's row"),
])
def test_bad_input_is_refused_before_anything_runs_with_the_fix(data_dir, tmp_path, capsys,
                                                                full_launcher, argv, message):
    out = tmp_path / "never"
    assert benchmark.main(["-dd", str(data_dir), "--out", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_horovod_on_without_horovod_is_refused_with_the_way_out(data_dir, tmp_path,
                                                                monkeypatch, full_launcher):
    import esync.common.collectives as collectives
    monkeypatch.setattr(collectives, "horovod_missing", lambda: "Horovod is not installed")
    with pytest.raises(options.UsageError, match="--horovod on: Horovod is not installed; or "
                                                 "give --horovod off"):
        args_for(data_dir, tmp_path, "--horovod", "on")
    args = args_for(data_dir, tmp_path)          # auto: left out, with a notice
    assert not args.horovod_rows and "Horovod rows left out" in args.horovod_notice
    assert not any("--collective" in r.extra for r in plan.rows(args))


# ----------------------------------------------------------------------------- the fast devices

def test_auto_fast_devices_are_those_within_twice_the_fastest():
    assert options.parse_fast_devices("auto", [1, 1, 4, 8]) == [0, 1]
    assert options.parse_fast_devices("auto", [2, 1.5, 4, 3]) == [0, 1, 3]
    assert options.parse_fast_devices("auto", [1, 1.5]) == []       # nothing left idle
    assert options.parse_fast_devices("cpu3,1", [1, 1, 4, 8]) == [1, 3]
    assert options.parse_fast_devices("none", [1, 1, 4, 8]) == []


def test_fast_device_rows_run_those_devices_under_the_clusters_caps(data_dir, tmp_path,
                                                                   full_launcher, monkeypatch):
    import esync.emulation.shaping as shaping
    monkeypatch.setattr(shaping, "x1_share", lambda args: 0.505)
    args = args_for(data_dir, tmp_path, "--repeats", "1", "--scenarios", "static",
                    "--bandwidth", "100mbit,110mbit,120mbit,130mbit")
    rows = plan.rows(args)
    fast = {r.name: r for r in rows if r.devices}
    assert list(fast) == ["sync-fast", "async-fast", "sync-allreduce-fast"]
    assert {r.name: r.group for r in rows if r.name.startswith("sync")} == {
        "sync": "sync", "sync-fast": "sync-fast", "sync-allreduce": "sync",
        "sync-allreduce-fast": "sync-fast"}
    rates = {"worker": ["100mbit", "110mbit", "120mbit", "130mbit"], "server": "100mbit"}
    jobs = plan.full_jobs(args, tmp_path, rows, plan.settings(args, rates),
                          {r.group: 0.001 for r in rows})
    for job in (j for j in jobs if j.row.devices):
        argv = job.argv
        assert (value_after(argv, "--workers"), value_after(argv, "--slowdown"),
                value_after(argv, "--cpu-share")) == ("2", "1,1", "0.505")
        # under auto the launcher would cap no device of factor 1: the caps are asked for
        assert value_after(argv, "--emulation") == "cpu-cap"
        assert not job.extended and value_after(argv, "--max-seconds") == "40.0"
        if job.setting.name == "netns":
            assert value_after(argv, "--bandwidth") == "100mbit,110mbit"
    # Table 1's SSGD is the parameter server's on the whole cluster only
    assert {j.name for j in jobs if j.extended} == {"sync"}


def test_fast_device_rows_sleep_like_the_cluster_where_caps_cannot_run(
        data_dir, tmp_path, full_launcher, monkeypatch):
    import esync.emulation.shaping as shaping
    monkeypatch.setattr(shaping, "x1_share", lambda args: None)      # no cgroups here
    args = args_for(data_dir, tmp_path, "--repeats", "1", "--scenarios", "static",
                    "--net", "loopback")
    rows = [r for r in plan.rows(args) if r.devices]
    jobs = plan.full_jobs(args, tmp_path, rows, plan.settings(args, None),
                          {r.group: 0.001 for r in rows})
    assert jobs and all(value_after(j.argv, "--emulation") == "auto"
                        and "--cpu-share" not in j.argv for j in jobs)


def test_no_fast_rows_where_the_user_says_none(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--fast-devices", "none", "--horovod", "off")
    assert not any(r.devices or "--collective" in r.extra for r in plan.rows(args))
    assert "--fast-devices none --horovod off" in options.canonical_command(args)


# ----------------------------------------------------------------------------- the grid

def test_every_baseline_row_is_tuned_at_each_momentum_with_the_rates_shifted_down(
        data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--fast-devices", "none", "--horovod", "off")
    jobs = plan.tuning_jobs(args, tmp_path, plan.rows(args))
    grid = {}
    for job in jobs:
        grid.setdefault(job.row.group, []).append(
            (job.lr, value_after(job.argv, "--momentum")))
    assert grid["sync"] == [(0.001, None), (0.003, None), (0.01, None)]
    assert grid["sync-momentum0.9"] == [(0.0001, "0.9"), (0.0003, "0.9"), (0.001, "0.9")]
    assert grid["local-momentum0.9"] == grid["sync-momentum0.9"]
    # ESync's outer step is its point of the momentum axis: no momentum group, no --momentum
    esync = [g for g in grid if g.startswith("esync")]
    assert esync and all("momentum0.9" not in g for g in esync)
    assert all(m is None for g in esync for _, m in grid[g])


def test_a_row_runs_with_the_pair_of_its_best_momentum(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,async", "--fast-devices", "none",
                    "--horovod", "off", "--scenarios", "static", "--net", "loopback",
                    "--repeats", "1")
    rows = plan.rows(args)
    tuning = {"sync": {"lr": 0.003, "scores": {0.001: 0.7, 0.003: 0.8, 0.01: 0.6}},
              "sync-momentum0.9": {"lr": 0.0003, "scores": {0.0001: 0.7, 0.0003: 0.84,
                                                            0.001: 0.5}},
              "async": {"lr": 0.003, "scores": {0.001: 0.7, 0.003: 0.82, 0.01: 0.6}},
              "async-momentum0.9": {"lr": 0.0003, "scores": {0.0001: 0.7, 0.0003: 0.81,
                                                             0.001: 0.5}}}
    pairs = plan.chosen_pairs(args, rows, tuning)
    assert pairs == {"sync": (0.0003, 0.9), "async": (0.003, 0.0)}
    lrs = benchmark.driver.chosen_rates(args, rows, tuning)
    momenta = benchmark.driver.chosen_momenta(args, rows, tuning)
    jobs = {j.name: j for j in plan.full_jobs(args, tmp_path, rows, plan.settings(args, None),
                                              lrs, momenta)}
    assert value_after(jobs["sync"].argv, "--momentum") == "0.9"
    assert value_after(jobs["sync"].argv, "-l") == "0.0003"
    assert "--momentum" not in jobs["async"].argv       # plain SGD: the original's command
    # the two best pairs of each row run again, whichever momentum they have
    again = {(j.row.group, j.lr) for j in plan.confirming_jobs(args, tmp_path, rows, tuning)}
    assert again == {("sync-momentum0.9", 0.0003), ("sync", 0.003),
                     ("async", 0.003), ("async-momentum0.9", 0.0003)}
    # only the winning momentum's grid widens (its best sits inside here: none)
    assert plan.widening_jobs(args, tmp_path, rows, tuning) == []
    tuning["sync-momentum0.9"]["scores"][0.001] = 0.9
    tuning["sync-momentum0.9"]["lr"] = 0.001
    assert {(j.row.group, j.lr) for j in plan.widening_jobs(args, tmp_path, rows, tuning)} \
        == {("sync-momentum0.9", 0.00316)}


def test_the_report_states_the_rule_and_each_rows_pair(data_dir, tmp_path, full_launcher):
    args = args_for(data_dir, tmp_path, "--modes", "sync,local", "--fast-devices", "none",
                    "--horovod", "off", "--scenarios", "static", "--net", "loopback",
                    "--repeats", "1")
    rows = plan.rows(args)
    tuning = {"sync": {"lr": 0.003, "scores": {0.003: 0.8}},
              "sync-momentum0.9": {"lr": 0.0003, "scores": {0.0003: 0.84}}}
    jobs = plan.full_jobs(args, tmp_path, rows, plan.settings(args, None),
                          {"sync": 0.0003, "local": 0.003}, {"sync": 0.9})
    labels = {r.name: r.label for r in rows}
    text = "\n".join(report.tuning_section(args, tuning, [r.name for r in rows], labels)
                     + report.pairs_section(jobs, labels))
    assert "every row is the best of the same grid, on the same budget" in text
    assert "| SSGD, momentum 0.9 (`sync-momentum0.9`) |" in text
    assert "| SSGD (`sync`) | -l 0.0003 | 0.9 |" in text
    assert "| Standalone SGD (`local`) | -l 0.003 | 0 (plain SGD) |" in text.replace(
        labels["local"], "Standalone SGD")


def test_dry_run_shows_the_momentum_runs_and_the_fast_rows(data_dir, tmp_path, full_launcher,
                                                           capsys):
    out = tmp_path / "dry"
    assert benchmark.main(["-dd", str(data_dir), "--out", str(out), "--dry-run", "--modes",
                           "sync", "--net", "loopback", "--repeats", "1", "--scenarios",
                           "static"]) == 0
    text = capsys.readouterr().out
    assert "every row but ESync's once per momentum 0, 0.9" in text
    assert "[tune sync-momentum0.9 lr 0.0001]" in text and "--momentum 0.9" in text
    assert "[rep 1 loopback sync-allreduce-fast]" in text and not out.exists()


# ----------------------------------------------------------------------------- vs best other

def _times(**medians):
    return {n: {"time_to_target": t, "final_accuracy": 0.86} for n, t in medians.items()}


def test_vs_best_other_counts_the_fast_devices_and_horovod_rows():
    per_rep = {name: [m] * 3 for name, m in _times(
        **{"esync-mean": 16.0, "sync": 40.0, "async": 30.0, "sync-fast": 22.0,
           "sync-allreduce-fast": 21.0}).items()}
    found = stats.aggregate(per_rep, horizon=40.0)
    assert found["esync-mean"]["vs_best_other"].other == "sync-allreduce-fast"
    assert found["esync-mean"]["vs_best_other"].value == pytest.approx(21 / 16)


# ----------------------------------------------------------------------------- the figures

def test_the_zoomed_axis_spans_where_the_rows_differ():
    medians = [np.array([0.1, 0.82, 0.85, 0.87]), np.array([0.1, 0.80, 0.84, 0.86])]
    highs = [np.array([0.1, 0.83, 0.86, 0.88]), np.array([0.1, 0.81, 0.85, 0.87])]
    low, high = compare.zoomed_range(medians, highs, target=0.85)
    assert (round(low, 2), round(high, 2)) == (0.1, 0.9)
    # one chance point in many: the axis starts near the rows, below the target
    medians = [np.concatenate([[0.1], np.linspace(0.8, 0.88, 30)])]
    low, high = compare.zoomed_range(medians, [medians[0]], target=0.85)
    assert (round(low, 2), round(high, 2)) == (0.8, 0.9)
    assert compare.zoomed_range([], [], target=0.85) is None


def test_the_lead_picture_draws_each_rows_median_and_range_per_setting():
    fig = Figure()
    times = {"esync-mean": {"loopback": (16.0, 15.0, 17.5), "netns": (24.5, 23.0, 26.0)},
             "sync-fast": {"loopback": (22.2, 20.9, 23.6), "netns": None}}
    assert compare.draw_time_to_target(fig, times, {}, target=0.85, budget=40, title="t")
    panels = {ax.get_title(): ax for ax in fig.axes}
    bars = {p.get_gid(): p.get_width() for p in panels["loopback"].patches}
    assert bars == {"esync-mean-loopback": 16.0, "sync-fast-loopback": 22.2}
    missed = [t.get_gid() for t in panels["netns"].texts]
    assert missed == ["esync-mean-netns-value", "sync-fast-netns-missed"]
    assert [t.get_text() for t in panels["loopback"].texts] == ["16.0 s", "22.2 s"]
    assert not compare.draw_time_to_target(Figure(), {"x": {"loopback": None}}, {},
                                           target=0.85, budget=40, title="t")


def test_the_lead_picture_puts_esync_first_and_caps_unreached_ends(tmp_path):
    import types
    from esync.benchmark.plan import LOOPBACK
    spread = stats.spread([20.0, 22.0, None], censored=True)
    results = {"loopback": {"names": ["sync-fast", "esync-mean", "sync-niid"],
                            "rows": {"sync-fast": {"ok": 3, "time": spread},
                                     "esync-mean": {"ok": 3, "time": stats.spread(
                                         [16.0, 15.0, 17.0], censored=True)},
                                     "sync-niid": {"ok": 3, "time": spread}}}}
    args = types.SimpleNamespace(budget=40.0)
    times = report.lead_times(args, results, [LOOPBACK])
    assert list(times) == ["esync-mean", "sync-fast"]             # i.i.d. rows, ESync first
    assert times["sync-fast"]["loopback"] == (22.0, 20.0, 40.0)


def test_the_report_names_the_fast_devices_and_what_the_default_trims(data_dir, tmp_path,
                                                                      full_launcher):
    text = "\n".join(report.alternatives_lines(args_for(data_dir, tmp_path)))
    assert "the fast devices alone: cpu0, cpu1 (×1, ×1), the rest idle" in text
    assert "rows SSGD and ASGD and Horovod's SSGD on them" in text
    sync_only = report.alternatives_lines(args_for(data_dir, tmp_path, "--modes", "esync,sync"))
    assert "rows SSGD and Horovod's SSGD on them" in sync_only[0]
    assert "Horovod's SSGD (`--collective allreduce`) on the whole cluster and on the fast" in text
    assert "no by-class rows (`--data both` adds them)" in text
    assert report.alternatives_lines(args_for(data_dir, tmp_path, "--niid", "--fast-devices",
                                              "none", "--horovod", "off")) == []


def test_table1_runs_only_the_whole_clusters_ssgd_past_the_budget():
    per_rep = {"sync": [{"time_to_table1": None, "time_to_table1_uncut": 60.0}] * 3,
               "sync-fast": [{"time_to_table1": 25.0, "time_to_table1_uncut": 25.0}] * 3,
               "esync-mean": [{"time_to_table1": 15.0}] * 3}
    rows = {r["name"]: r for r in stats.table1(per_rep, budget=40, sync_cap=100)}
    assert (rows["sync"]["horizon"], rows["sync-fast"]["horizon"]) == (100, 40)
    assert rows["sync-fast"]["vs_sync"].value == pytest.approx(60 / 25)
    assert rows["sync"]["vs_sync"] is None
