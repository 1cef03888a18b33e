"""esync-drawer's --zoom-accuracy: the accuracy axis spans where the modes differ (the
benchmark's figures always zoom; the drawer keeps the original's 0-1 unless asked)."""
import numpy as np
import pytest
from matplotlib.figure import Figure

import logmaker
from esync.analysis import drawer


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    network_dir = logmaker.write_layout(tmp_path_factory.mktemp("zoom"),
                                        modes=("esync", "sync", "async", "dcasgd", "local"))
    return drawer.load_summaries(network_dir, notify=lambda _: None)


def test_the_accuracy_axis_zooms_only_when_asked(summaries):
    plain, zoomed = Figure(), Figure()
    assert drawer.draw_accuracy(plain, summaries, niid=False, network="lenet")
    assert drawer.draw_accuracy(zoomed, summaries, niid=False, network="lenet", zoom=True)
    assert plain.axes[0].get_ylim() == (0, 1)
    # every evaluator record of the four modes: its 10th percentile (0.41) and its top (0.86),
    # rounded outwards to 0.05
    records = np.array([a for base in ("esync", "sync", "async", "dcasgd")
                        for _, _, a in logmaker.EVALUATIONS[base]])
    assert np.quantile(records, 0.1) == pytest.approx(0.41)
    assert zoomed.axes[0].get_ylim() == pytest.approx((0.4, 0.9))
    assert "zoomed" in zoomed.axes[0].get_ylabel()


def test_the_option_reaches_the_figures(tmp_path):
    assert drawer.build_parser().parse_args(["-n", "lenet", "--zoom-accuracy"]).zoom_accuracy
    assert not drawer.build_parser().parse_args(["-n", "lenet"]).zoom_accuracy
