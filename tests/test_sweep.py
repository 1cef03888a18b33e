"""The heterogeneity sweep's plan (rows, clusters and CPU caps per gap) and the journal testbed's
flags (esync/benchmark/sweep.py, options.TESTBEDS). Nothing here starts a cluster."""
from __future__ import annotations

import pytest

from support import write_fashion_dir
from esync import benchmark
from esync.benchmark import sweep
from esync.common.errors import UsageError

GAPS = "1,16,150"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_fashion_dir(tmp_path_factory.mktemp("sweep") / "data", train_per_class=10,
                             test_per_class=5)


def sweep_args(data_dir, tmp_path, *extra):
    args = benchmark.parse_args(["-dd", str(data_dir), "--out", str(tmp_path / "o"),
                                 "--gap-sweep", GAPS, "--cpu-share", "0.3",
                                 "--emulation", "auto", *extra])
    sweep.resolve(args)
    return args


def flag(argv: list[str], name: str) -> str:
    """The value of the last ``name`` in ``argv`` (what argparse keeps)."""
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1]


def test_every_gap_keeps_the_two_fast_devices_and_puts_two_at_the_gap():
    assert sweep.gap_factors(150) == [1.0, 1.0, 150.0, 150.0]


def test_the_plan_runs_the_rows_without_slow_devices_once_then_every_gap(data_dir, tmp_path):
    plans = sweep.build(sweep_args(data_dir, tmp_path), tmp_path / "o")
    assert [p.name for p in plans] == ["alone", "gap1", "gap16", "gap150"]


def test_each_gap_runs_esync_ssgd_asgd_and_dcasgd_on_the_whole_cluster(data_dir, tmp_path):
    plans = sweep.build(sweep_args(data_dir, tmp_path), tmp_path / "o")
    assert all([r.name for r in p.rows] == ["esync", "sync", "async", "dcasgd"]
               for p in plans[1:])


def test_esync_runs_under_the_launchers_defaults(data_dir, tmp_path):
    gap = sweep.build(sweep_args(data_dir, tmp_path), tmp_path / "o")[2]
    job = next(j for j in gap.tune_jobs if j.row.name == "esync")
    assert "--aggregation" not in job.argv and "--comm-share" not in job.argv


def test_a_gaps_runs_have_its_cluster(data_dir, tmp_path):
    gap = sweep.build(sweep_args(data_dir, tmp_path), tmp_path / "o")[3]
    assert {(flag(j.argv, "--workers"), flag(j.argv, "--slowdown")) for j in gap.tune_jobs} \
        == {("4", "1,1,150,150")}


def test_the_fast_devices_alone_are_two_x1_devices_with_momentum(data_dir, tmp_path):
    alone = sweep.build(sweep_args(data_dir, tmp_path), tmp_path / "o")[0]
    job = next(j for j in alone.tune_jobs if j.row.name == sweep.FAST_ALONE)
    assert (flag(job.argv, "--workers"), flag(job.argv, "--slowdown"),
            flag(job.argv, "--momentum")) == ("2", "1,1", "0.9")


def test_one_device_alone_is_part_of_the_rows_without_slow_devices(data_dir, tmp_path):
    alone = sweep.build(sweep_args(data_dir, tmp_path), tmp_path / "o")[0]
    assert [r.name for r in alone.rows] == [sweep.ESYNC_FAST_ALONE, sweep.FAST_ALONE, "local"]


def test_esync_on_the_fast_devices_alone_runs_its_defaults_on_two_x1_devices(data_dir,
                                                                             tmp_path):
    alone = sweep.build(sweep_args(data_dir, tmp_path), tmp_path / "o")[0]
    job = next(j for j in alone.tune_jobs if j.row.name == sweep.ESYNC_FAST_ALONE)
    assert (flag(job.argv, "-m"), flag(job.argv, "--workers"), flag(job.argv, "--slowdown")) \
        == ("esync", "2", "1,1")
    assert "--aggregation" not in job.argv and "--momentum" not in job.argv


def test_modes_keep_their_rows_at_every_gap_and_without_the_slow_devices(data_dir, tmp_path):
    plans = sweep.build(sweep_args(data_dir, tmp_path, "--modes", "esync"), tmp_path / "o")
    assert [[r.name for r in p.rows] for p in plans] == [
        [sweep.ESYNC_FAST_ALONE], ["esync"], ["esync"], ["esync"]]
    plans = sweep.build(sweep_args(data_dir, tmp_path, "--modes", "sync,local"), tmp_path / "o")
    assert [r.name for r in plans[0].rows] == [sweep.FAST_ALONE, "local"]
    assert [r.name for r in plans[1].rows] == ["sync"]


def test_modes_without_a_cluster_mode_are_refused(data_dir, tmp_path):
    with pytest.raises(UsageError, match="has none of them"):
        sweep_args(data_dir, tmp_path, "--modes", "local")


def test_every_cluster_run_gives_a_x1_device_the_same_cap(data_dir, tmp_path):
    plans = sweep.build(sweep_args(data_dir, tmp_path), tmp_path / "o")
    shares = {flag(j.argv, "--cpu-share") for p in plans for j in p.tune_jobs
              if not j.standalone}
    assert shares == {"0.3"}


def test_every_cluster_run_is_capped_even_where_no_device_is_slower_than_x1(data_dir, tmp_path):
    # under "auto" the launcher would cap nothing at gap 1 and for the fast devices alone
    plans = sweep.build(sweep_args(data_dir, tmp_path), tmp_path / "o")
    assert {flag(j.argv, "--emulation") for p in plans for j in p.tune_jobs
            if not j.standalone} == {"cpu-cap"}


def test_each_row_is_tuned_at_every_gap(data_dir, tmp_path):
    plans = sweep.build(sweep_args(data_dir, tmp_path, "--tune-lr", "0.001,0.003"),
                        tmp_path / "o")
    # ESync 2 rates; SSGD, ASGD and DC-ASGD 2 rates x momentum 0 and 0.9; without the slow
    # devices 3 rows x 2 rates
    assert [len(p.tune_jobs) for p in plans] == [6, 14, 14, 14]


def test_the_whole_clusters_baselines_are_tuned_with_and_without_momentum(data_dir, tmp_path):
    """ESync's outer step has momentum, so SSGD, ASGD and DC-ASGD get the benchmark's momentum
    axis (fair comparisons); SSGD on the fast devices alone keeps its fixed 0.9."""
    plans = sweep.build(sweep_args(data_dir, tmp_path, "--tune-lr", "0.003"), tmp_path / "o")
    momenta = {}
    for job in plans[1].tune_jobs:
        momenta.setdefault(job.row.name, set()).add(
            flag(job.argv, "--momentum") if "--momentum" in job.argv else "0")
    assert momenta["esync"] == {"0"}
    assert {momenta[m] == {"0", "0.9"} for m in ("sync", "async", "dcasgd")} == {True}
    assert {flag(j.argv, "--momentum") for j in plans[0].tune_jobs
            if j.row.name == sweep.FAST_ALONE} == {"0.9"}


def test_the_full_runs_interleave_the_gaps_repeat_by_repeat(data_dir, tmp_path):
    args = sweep_args(data_dir, tmp_path, "--repeats", "2")
    plans = sweep.build(args, tmp_path / "o")
    rates = {p.name: {r.group: 0.003 for r in p.rows} for p in plans}
    order = [(j.rep, j.root.parent.parent.parent.name) for j in sweep.full_jobs(plans, rates)]
    assert order == sorted(order, key=lambda pair: pair[0]) and order[0][0] == order[14][0] == 1


def test_the_sweep_share_fits_the_tightest_gap_beside_the_reserve():
    # 1:1 is the tightest: four x1 devices share 2 cores minus 0.8 -> 0.3 each
    assert sweep.sweep_share([1, 4, 300], cores=2) == pytest.approx(0.3)


def test_a_slow_devices_cap_is_the_share_over_the_gap_with_a_longer_period():
    cap = sweep.device_cap(0.3, 150, min_run_us=1000)
    assert (cap.cores, cap.quota_us, cap.period_us) == (pytest.approx(0.002), 1000, 500_000)


def test_granularity_is_the_throttled_stretch_over_one_iterations_wall_time():
    cap = sweep.device_cap(0.3, 150, min_run_us=1000)
    # an iteration of 30 ms of CPU at 1 ms per 500 ms lasts 15 s; it ends within 499 ms
    assert cap.granularity(0.030) == pytest.approx(0.499 / 15.0)


def test_a_half_core_cap_with_the_kernels_slice_is_coarse_for_a_20_ms_iteration():
    cap = sweep.device_cap(0.5, 1, min_run_us=5000)
    # 5 ms per 10 ms: a 20 ms iteration lasts 40 ms and ends within a 5 ms stall: 12.5%
    assert cap.coarse(0.020) and cap.granularity(0.020) == pytest.approx(0.125)


def test_coarse_gaps_lists_only_the_gaps_past_the_threshold():
    # x1 at 3 ms / 10 ms: a 20 ms iteration lasts 66.7 ms and ends within a 7 ms stall (10.5%);
    # x16 at 1 ms / 53.3 ms: 1.07 s, within 52.3 ms (4.9%)
    assert sweep.coarse_gaps([1, 16], 0.3, 0.020, 1000) == [1]


def test_a_gap_whose_cap_falls_under_the_kernels_smallest_is_refused():
    with pytest.raises(UsageError, match="gap 400"):
        sweep.check_caps([1, 400], 0.3)


@pytest.mark.parametrize("text", ["0.5,4", "x", ""])
def test_a_gap_list_that_is_not_numbers_from_1_up_is_refused(text):
    with pytest.raises(UsageError, match="--gap-sweep"):
        sweep.parse_gaps(text)


def test_the_journal_testbed_is_six_fast_and_six_slow_devices_at_150(data_dir, tmp_path):
    args = benchmark.parse_args(["-dd", str(data_dir), "--out", str(tmp_path / "o"),
                                 "--testbed", "esync-journal"])
    assert (args.workers, args.slowdowns, args.table1_target) == (
        12, [1.0] * 6 + [150.0] * 6, 0.80)


def test_the_journal_testbed_compares_esync_with_ssgd_and_one_device(data_dir, tmp_path):
    args = benchmark.parse_args(["-dd", str(data_dir), "--out", str(tmp_path / "o"),
                                 "--testbed", "esync-journal"])
    assert args.mode_list == ["esync", "sync", "local"]


def test_flags_after_the_testbed_override_it(data_dir, tmp_path):
    args = benchmark.parse_args(["-dd", str(data_dir), "--out", str(tmp_path / "o"),
                                 "--testbed", "esync-journal", "--modes", "esync,sync"])
    assert args.mode_list == ["esync", "sync"]


def hand_made_results(plans, times: dict[str, dict[str, list]]) -> dict:
    """``metrics.results``-shaped entries holding only each row's times to the target."""
    from esync.benchmark import stats
    return {p.name: {"rows": {name: {"time": stats.spread(values, censored=True)}
                              for name, values in times[p.name].items()}, "per_rep": {}}
            for p in plans[1:]}


def test_the_table_has_a_column_per_gap_and_bolds_each_gaps_fastest_row(data_dir, tmp_path):
    args = sweep_args(data_dir, tmp_path, "--budget", "30")
    plans = sweep.build(args, tmp_path / "o")
    alone = {sweep.FAST_ALONE: [20.0], "local": [28.0]}
    results = hand_made_results(plans, {
        "gap1": {"esync": [10.0], "sync": [15.0], "async": [12.0], "dcasgd": [13.0], **alone},
        "gap16": {"esync": [22.0], "sync": [None], "async": [25.0], "dcasgd": [26.0], **alone},
        "gap150": {"esync": [None], "sync": [None], "async": [29.0], "dcasgd": [None],
                   **alone}})
    lines = sweep.table(plans, results, 0.85)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert rows["ESync (the launcher's defaults)"][:2] == ["**10.0**", "22.0"]
    assert rows[sweep.alone_rows()[1].label][2].rstrip(" |") == "**20.0**"
    assert rows["ESync (the launcher's defaults)"][2].rstrip(" |") == "not reached in 30 s"
    lead = [cell.rstrip(" |") for cell in rows["*ESync's lead: the next row's median over its own*"]]
    # 12.0 / 10.0 (ASGD next); 20.0 / 22.0 (the fast devices alone sooner); not reached
    assert lead[:2] == ["1.20× over ASGD", "0.91× over " + sweep.alone_rows()[1].label]
    # ESync not within 30 s, the fast devices alone at 20.0: at most 20 / 30
    assert lead[2] == "< 0.67× over " + sweep.alone_rows()[1].label


def test_the_advisor_table_sets_each_gaps_median_prediction_against_the_measured(data_dir,
                                                                                tmp_path):
    """Each gap's ESync runs (recorded logs: two x1 devices, two x8, as test_advise's) predict
    13.0 s on every device and 47.4 s on the fast devices alone (test_advise's arithmetic: a
    first round of 1.5 s and 288 samples, then 288 samples per 1.5 s round; alone, a first
    round of 0.625 s holding 2/3 x 256 x 0.625 samples, then 32 per 0.625 s round); the errors
    are against the medians."""
    from test_advise import DEVICES, write_run
    args = sweep_args(data_dir, tmp_path, "--modes", "esync", "--repeats", "1")
    plans = sweep.build(args, tmp_path / "o")
    sweep.full_jobs(plans, {p.name: {r.group: 0.003 for r in p.rows} for p in plans})
    for p in plans[1:]:
        for job in p.jobs:
            write_run(job.root, devices={**DEVICES, "cpu3": DEVICES["cpu2"]})
            job.folder, job.summary = job.root / "lenet" / "esync", {}
    alone = {sweep.ESYNC_FAST_ALONE: [50.0]}
    results = hand_made_results(plans, {"gap1": {"esync": [10.0], **alone},
                                        "gap16": {"esync": [None], **alone},
                                        "gap150": {"esync": [13.5], **alone}})
    lines = sweep.advisor_rows(plans, results, 0.8)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]
             if line.startswith("|")]
    # the fast devices alone run rounds of one iteration each, the gap's runs held 8: a caveat
    assert cells[0][:7] == ["1:1", "13.0", "10.0", "+30%", "47.4†", "50.0", "-5%"]
    assert lines[-1].startswith("† with the advisor's caveat")
    assert cells[1][3] == "-"                         # not reached: no error
    assert cells[2][3] == "-4%"
    assert cells[0][7] == "include vm/cpu2; include vm/cpu3"


def test_the_full_runs_take_each_rows_tuned_momentum(data_dir, tmp_path):
    args = sweep_args(data_dir, tmp_path, "--repeats", "1")
    plans = sweep.build(args, tmp_path / "o")
    rates = {p.name: {r.group: 0.003 for r in p.rows} for p in plans}
    jobs = sweep.full_jobs(plans, rates, {"gap16": {"async": 0.9}})
    momentum = {(j.root.parent.parent.parent.name, j.row.name):
                flag(j.argv, "--momentum") if "--momentum" in j.argv else "0" for j in jobs}
    assert momentum["gap16", "async"] == "0.9"
    assert momentum["gap1", "async"] == momentum["gap16", "sync"] == "0"
