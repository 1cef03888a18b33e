"""drawer: the five figures as real PNG and SVG files, summaries made on demand, notices."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


def test_main_succeeds(drawn):
    assert drawn[0] == 0


@pytest.mark.parametrize("name", FIGURES)
def test_png_is_a_real_image(drawn, name):
    data = figure(drawn[1], name, "png").read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000


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
        assert (drawn[1] / mode / summary.summary_name(mode)).is_file()


def test_speedup_table_is_written_beside_the_figures(drawn):
    text = (drawn[1] / "figures" / "speedup.md").read_text(encoding="utf-8")
    assert "| ESync | 1 | 2.0 | 3.00× |" in text
    assert (drawn[1] / "figures" / "speedup.csv").stat().st_size > 0


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
    assert (out / "lenet-accuracy-iid.png").is_file()


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
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "lenet" / "figures" / "lenet-accuracy-iid.svg").is_file()


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
