"""compare: the benchmark's figures plot the rows' own data (read back from matplotlib)."""
import math

import pytest
from matplotlib.figure import Figure

import logmaker
from esync.analysis import compare, summary


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    found = {}
    for name, mode in (("esync-mean", "esync"), ("esync-fednova", "esync"), ("sync", "sync"),
                       ("local", "local")):
        found[name] = summary.summarize(logmaker.write_mode(root / name, mode))
    return found


def test_accuracy_lines_are_each_rows_evaluator_records(summaries):
    fig = Figure()
    assert compare.draw_accuracy_rows(fig, summaries, {}, title="t", target=0.85)
    lines = {ln.get_gid(): list(zip(ln.get_xdata(), ln.get_ydata()))
             for ln in fig.axes[0].get_lines()}
    assert lines["esync-fednova"] == [(t, a) for _, t, a in logmaker.EVALUATIONS["esync"]]
    assert lines["local"] == [((n + 1) * logmaker.STANDALONE.step, a)
                              for n, a in enumerate(logmaker.LOCAL_ACCURACIES)]
    assert lines["target"] == [(0, 0.85), (1, 0.85)]


def test_variants_of_one_mode_share_its_colour_but_not_the_line_style(summaries):
    styles = compare.row_styles(list(summaries))
    assert styles["esync-mean"]["color"] == styles["esync-fednova"]["color"] == "m"
    assert styles["esync-mean"]["linestyle"] != styles["esync-fednova"]["linestyle"]


def test_setting_bars_one_per_setting_with_gaps_for_missing_values():
    fig = Figure()
    values = {"sync": {"loopback": 10.0, "netns": 4.0}, "local": {"loopback": 7.0, "netns": None}}
    assert compare.draw_setting_bars(fig, values, {"sync": "SSGD"}, ylabel="y", title="t")
    bars = {}
    for patch in fig.axes[0].patches:
        bars.setdefault(patch.get_gid(), []).append(patch.get_height())
    assert bars["loopback"] == [10.0, 7.0]
    assert bars["netns"][0] == 4.0 and math.isnan(bars["netns"][1])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["SSGD", "local"]
