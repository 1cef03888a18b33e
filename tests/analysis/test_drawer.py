"""drawer: what each figure plots (read back from matplotlib's objects and the written files),
summaries made on demand, notices, the traffic estimate for the original's logs."""
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import pytest
from matplotlib.figure import Figure

import logmaker
from esync.analysis import drawer, summary

REPO_ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALL_MODES = ("esync", "sync", "async", "dcasgd", "local", "esync-niid", "sync-niid")
FIGURES = {
    "accuracy-iid": "Test accuracy (i.i.d.) — lenet",
    "accuracy-niid": "Test accuracy (non-i.i.d.) — lenet",
    "data-throughput": "Data throughput — lenet",
    "traffic-load": "Traffic load — lenet",
    "computing-time-ratio": "Computing-time ratio — lenet",
}


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """``drawer.main`` once over every mode; esync already summarised, the rest not."""
    root = tmp_path_factory.mktemp("logs")
    network_dir = logmaker.write_layout(root, modes=ALL_MODES)
    summary.write_summary(network_dir / "esync")
    code = drawer.main(["-b", str(root), "-n", "lenet"])
    return code, network_dir


def figure(network_dir, name, ext):
    return network_dir / "figures" / f"lenet-{name}.{ext}"


def test_main_writes_png_and_svg_of_every_figure_and_nothing_else(drawn):
    code, network_dir = drawn
    written = sorted(p.name for p in (network_dir / "figures").iterdir())
    expected = sorted([f"lenet-{n}.{ext}" for n in FIGURES for ext in ("png", "svg")]
                      + ["speedup.csv", "speedup.md"])
    assert (code, written) == (0, expected)


@pytest.mark.parametrize("name, colour", [("accuracy-iid", "m"), ("traffic-load", "orange")])
def test_png_shows_the_mode_colours(drawn, name, colour):
    """The PNG is a decodable image with pixels of the plotted modes' colours."""
    image = matplotlib.image.imread(figure(drawn[1], name, "png"))[..., :3]
    rgb = matplotlib.colors.to_rgb(colour)
    assert (abs(image - rgb).max(axis=-1) < 0.02).sum() > 50


@pytest.mark.parametrize("name, title", FIGURES.items())
def test_svg_carries_the_title(drawn, name, title):
    assert title in figure(drawn[1], name, "svg").read_text(encoding="utf-8")


def test_iid_accuracy_legend_has_every_mode_and_the_standalone_line(drawn):
    svg = figure(drawn[1], "accuracy-iid", "svg").read_text(encoding="utf-8")
    for label in ("ESync", "SSGD", "ASGD", "DC-ASGD", "Standalone SGD (0.880)"):
        assert f">{label}<" in svg


def test_niid_accuracy_legend_has_the_niid_modes_only(drawn):
    svg = figure(drawn[1], "accuracy-niid", "svg").read_text(encoding="utf-8")
    assert ">ESync<" in svg and ">SSGD<" in svg and "Standalone SGD (0.880)" in svg
    assert ">ASGD<" not in svg


def test_bar_figures_label_modes_and_devices(drawn):
    svg = figure(drawn[1], "computing-time-ratio", "svg").read_text(encoding="utf-8")
    for label in ("ESync", "SSGD", "ASGD", "DC-ASGD", "Standalone SGD", "ESync (non-i.i.d.)",
                  "alpha", "cpu1"):
        assert f">{label}<" in svg
    traffic = figure(drawn[1], "traffic-load", "svg").read_text(encoding="utf-8")
    assert ">SSGD (non-i.i.d.)<" in traffic


def test_missing_summaries_were_written(drawn):
    for mode in ALL_MODES:
        written = summary.load_summary(drawn[1] / mode / summary.summary_name(mode))
        assert written["_totals"] == summary.summarize(drawn[1] / mode)["_totals"], mode


def test_speedup_table_is_written_beside_the_figures(drawn):
    text = (drawn[1] / "figures" / "speedup.md").read_text(encoding="utf-8")
    assert "| ESync | 1 | 2.0 | 3.00× |" in text
    with (drawn[1] / "figures" / "speedup.csv").open() as fp:
        rows = {row["mode"]: row for row in csv.DictReader(fp)}
    assert float(rows["esync"]["speedup"]) == pytest.approx(3.0)


def test_figures_without_data_are_skipped_with_a_notice(tmp_path):
    network_dir = tmp_path / "lenet"
    logmaker.write_mode(tmp_path, "esync", extras=False)   # no byte counts, i.i.d. only
    notices = []
    written = drawer.draw_all(drawer.load_summaries(network_dir, notify=notices.append),
                              tmp_path / "out", network="lenet", notify=notices.append)
    names = {p.name for p in written}
    assert "lenet-accuracy-iid.png" in names and "lenet-computing-time-ratio.svg" in names
    assert not any("niid" in n or "traffic" in n for n in names)
    assert any(n.startswith("accuracy-niid: no data") for n in notices)
    assert any("esync logs no byte counts" in n for n in notices)
    assert any("no standalone" in n for n in notices)


def test_mode_folder_without_logs_or_summary_is_skipped_with_a_notice(tmp_path):
    logmaker.write_mode(tmp_path, "sync")
    (tmp_path / "lenet" / "async").mkdir()
    notices = []
    summaries = drawer.load_summaries(tmp_path / "lenet", notify=notices.append)
    assert list(summaries) == ["sync"]
    assert any("skipping" in n and "async" in n for n in notices)


def test_stale_summary_is_made_again(tmp_path):
    mode_dir = logmaker.write_mode(tmp_path, "sync")
    path = summary.write_summary(mode_dir)
    old = time.time() - 100
    os.utime(path, (old, old))
    notices = []
    drawer.load_summaries(tmp_path / "lenet", notify=notices.append)
    assert any("again" in n for n in notices)
    assert path.stat().st_mtime > old


def test_two_log_roots_give_n_2_and_out_folder(tmp_path, capsys):
    roots = []
    for i in (1, 2):
        logmaker.write_layout(tmp_path / f"rep{i}", modes=("esync", "sync"))
        roots.append(str(tmp_path / f"rep{i}"))
    out = tmp_path / "out"
    assert drawer.main(["-b", *roots, "-n", "lenet", "-o", str(out), "--target", "0.5"]) == 0
    text = (out / "speedup.md").read_text(encoding="utf-8")
    assert "(n=2)" in text and "Time to 0.50" in text
    assert "Test accuracy (i.i.d.) — lenet" in (out / "lenet-accuracy-iid.svg").read_text()


def test_missing_network_folder_exits_2(tmp_path, capsys):
    assert drawer.main(["-b", str(tmp_path), "-n", "lenet"]) == 2
    assert str(tmp_path / "lenet") in capsys.readouterr().err


def test_corrupt_log_exits_2_naming_the_file(tmp_path, capsys):
    mode_dir = logmaker.write_mode(tmp_path, "sync")
    bad = mode_dir / "beta" / "gpu0" / "iter-2.txt"
    bad.write_text("{")
    assert drawer.main(["-b", str(tmp_path), "-n", "lenet"]) == 2
    assert str(bad) in capsys.readouterr().err


def test_wrapper_script_draws_headless(tmp_path):
    logmaker.write_layout(tmp_path, modes=("esync", "local"))
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "MPLBACKEND")}
    proc = subprocess.run(
        [sys.executable, "analysis/drawer.py", "-b", str(tmp_path), "-n", "lenet"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    svg = (tmp_path / "lenet" / "figures" / "lenet-accuracy-iid.svg").read_text()
    assert ">ESync<" in svg and "Standalone SGD (0.880)" in svg


def original_summary(accuracies):
    """A summary as the original's summary.py wrote it (whole seconds, no extras)."""
    rounds = len(accuracies)
    entry = {"num_samples_list": [64] * rounds, "self_iters_list": [5] * rounds,
             "elapsed_time_list": [60 * (n + 1) for n in range(rounds)],
             "aggregate_time_list": [1.5] * rounds}
    return {"cloud3": {"gpu0": {**entry, "accuracy_list": accuracies},
                       "cpu": {**entry, "accuracy_list": []}}}


def test_summaries_of_the_original_still_draw(tmp_path):
    for mode, accs in (("esync", [0.5, 0.82, 0.9]), ("sync", [0.3, 0.6, 0.81])):
        (tmp_path / "lenet" / mode).mkdir(parents=True)
        path = tmp_path / "lenet" / mode / summary.summary_name(mode)
        path.write_text(json.dumps(original_summary(accs)))
    notices = []
    summaries = drawer.load_summaries(tmp_path / "lenet", notify=notices.append)
    written = {p.name for p in drawer.draw_all(summaries, tmp_path / "out", network="lenet",
                                               notify=notices.append)}
    assert {"lenet-accuracy-iid.svg", "lenet-data-throughput.svg"} <= written
    assert "lenet-computing-time-ratio.svg" not in written
    assert any("computing-time ratio: esync has none" in n for n in notices)
    rows = {r["mode"]: r for r in drawer.speedup_table([summaries])}
    assert rows["esync"]["speedup"] == pytest.approx(180 / 120)


# ----------------------------------------------------------------------------- plotted data

@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    network_dir = logmaker.write_layout(tmp_path_factory.mktemp("plot"), modes=ALL_MODES)
    return drawer.load_summaries(network_dir, notify=lambda _: None)


def bar_heights(ax) -> dict:
    """{tick label: bar height} of a one-bar-per-mode axis."""
    labels = [t.get_text() for t in ax.get_xticklabels()]
    return dict(zip(labels, [p.get_height() for p in ax.patches]))


def wall(mode):
    """The slowest device's last total_time in logmaker's logs."""
    rounds = logmaker.ROUNDS[mode]
    if mode == "esync":
        return max(rounds * (d.k * d.step + (d.k + 1) * logmaker.READY + logmaker.AGGREGATE
                             + logmaker.RESET) for d in logmaker.CLUSTER)
    return max(rounds * (d.step + logmaker.AGGREGATE) for d in logmaker.CLUSTER)


def test_accuracy_lines_are_the_evaluator_records(summaries):
    fig = Figure()
    assert drawer.draw_accuracy(fig, summaries, niid=False, network="lenet")
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines() if line.get_gid()}
    assert sorted(lines) == ["async", "dcasgd", "esync", "sync"]
    for mode, line in lines.items():
        expected = [(t, a) for _, t, a in logmaker.EVALUATIONS[mode]]
        assert list(zip(line.get_xdata(), line.get_ydata())) == expected, mode


def test_accuracy_dashed_line_is_standalone_final_accuracy(summaries):
    fig = Figure()
    drawer.draw_accuracy(fig, summaries, niid=True, network="lenet")
    dashed = [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "--"]
    assert [list(ln.get_ydata()) for ln in dashed] == [[logmaker.LOCAL_ACCURACIES[-1]] * 2]


def test_throughput_bars_are_samples_over_wall_time(summaries):
    fig = Figure()
    drawer.draw_throughput(fig, {m: summaries[m] for m in ("sync", "esync")}, network="lenet")
    heights = bar_heights(fig.axes[0])
    sync_samples = len(logmaker.CLUSTER) * logmaker.ROUNDS["sync"] * logmaker.BATCH
    esync_samples = sum(d.k for d in logmaker.CLUSTER) * logmaker.ROUNDS["esync"] * logmaker.BATCH
    assert heights == pytest.approx({"SSGD": sync_samples / wall("sync"),
                                     "ESync": esync_samples / wall("esync")})


def test_traffic_bars_are_the_counted_bytes(summaries):
    fig = Figure()
    drawer.draw_traffic(fig, {m: summaries[m] for m in ("sync", "local")}, network="lenet")
    per_round = logmaker.PUSHED + logmaker.PULLED
    expected = len(logmaker.CLUSTER) * logmaker.ROUNDS["sync"] * per_round / wall("sync") / 1e6
    assert bar_heights(fig.axes[0]) == pytest.approx({"SSGD": expected,
                                                      "Standalone SGD": 0.0})


def test_computing_time_ratio_bars_per_device(summaries):
    fig = Figure()
    drawer.draw_computing_ratio(fig, {"sync": summaries["sync"]}, network="lenet")
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    heights = dict(zip(ticks, [p.get_height() for p in fig.axes[0].patches]))
    expected = {f"{d.host}\n{d.device}": d.step / (d.step + logmaker.AGGREGATE)
                for d in logmaker.CLUSTER}
    assert heights == pytest.approx(expected)


# ----------------------------------------------------------------------------- traffic estimate

def original_layout(root):
    """sync and local folders as the original wrote them: no byte counts."""
    for mode in ("sync", "local"):
        logmaker.write_mode(root, mode, extras=False)
    return root / "lenet"


def test_lenet_size_from_the_zoo_is_its_parameter_count():
    # conv 1->20 5x5, conv 20->50 5x5, dense 800->500, dense 500->10, with biases; float32.
    params = (20 * 25 + 20) + (50 * 20 * 25 + 50) + (800 * 500 + 500) + (500 * 10 + 10)
    assert drawer.model_size_from_zoo("lenet").bytes == 4 * params


def test_traffic_of_logs_without_byte_counts_is_estimated_from_the_model_size(tmp_path):
    summaries = drawer.load_summaries(original_layout(tmp_path), notify=lambda _: None)
    model = drawer.ModelSize(2_000_000, "given with --model-mb")
    fig = Figure()
    assert drawer.draw_traffic(fig, summaries, network="lenet", notify=lambda _: None,
                               model=model)
    rounds = len(logmaker.CLUSTER) * logmaker.ROUNDS["sync"]
    assert bar_heights(fig.axes[0]) == pytest.approx(
        {"SSGD": 2 * 2.0 * rounds / wall("sync"), "Standalone SGD": 0.0})


def test_estimated_traffic_is_hatched_and_says_so_on_the_figure(tmp_path):
    summaries = drawer.load_summaries(original_layout(tmp_path), notify=lambda _: None)
    fig = Figure()
    drawer.draw_traffic(fig, summaries, network="lenet", notify=lambda _: None,
                        model=drawer.ModelSize(1_724_320, "lenet from the model zoo"))
    note = next(t.get_text() for t in fig.texts if t.get_gid() == "traffic-estimate-note")
    assert "estimated" in note and "1.72 MB, lenet from the model zoo" in note
    assert {p.get_hatch() for p in fig.axes[0].patches} == {"//"}


def test_drawer_takes_the_model_size_from_the_zoo_for_original_logs(tmp_path):
    original_layout(tmp_path)
    assert drawer.main(["-b", str(tmp_path), "-n", "lenet"]) == 0
    svg = (tmp_path / "lenet" / "figures" / "lenet-traffic-load.svg").read_text()
    assert "lenet from the model zoo" in svg


def test_model_mb_overrides_the_zoo(tmp_path):
    original_layout(tmp_path)
    assert drawer.main(["-b", str(tmp_path), "-n", "lenet", "--model-mb", "3.5"]) == 0
    svg = (tmp_path / "lenet" / "figures" / "lenet-traffic-load.svg").read_text()
    assert "3.5 MB, given with --model-mb" in svg


def test_unknown_network_without_model_mb_leaves_the_traffic_out_with_a_notice(tmp_path):
    logmaker.write_mode(tmp_path, "sync", extras=False, network="mynet")
    notices = []
    summaries = drawer.load_summaries(tmp_path / "mynet", notify=notices.append)
    assert drawer.model_size_for(summaries, "mynet", None, notify=notices.append) is None
    assert any("--model-mb" in n for n in notices)
