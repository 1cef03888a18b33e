"""The mode registry: one table drives folder names, labels, colours and algorithm classes."""
from argparse import Namespace
from pathlib import Path

import pytest

from esync.common import modes, runlayout
from esync.worker.algorithms import algorithm_class, mode_dir_name
from esync.worker.algorithms.base import Algorithm


@pytest.mark.parametrize("mode", modes.MODES, ids=lambda m: m.name)
def test_every_mode_imports_an_algorithm_class(mode):
    assert issubclass(mode.algorithm_class(), Algorithm)


def test_cli_values_map_to_the_registry_classes():
    from esync.worker.algorithms.async_ import DCASGD, AsyncSGD, MXNetDCASGD
    assert ([algorithm_class("async", d) for d in (0, 1, 2)]
            == [AsyncSGD, DCASGD, MXNetDCASGD])


def test_the_mxnet_dcasgd_variant_is_not_in_the_benchmark_default():
    from esync.common import modes
    assert "dcasgd-mxnet" in modes.NAMES and "dcasgd-mxnet" not in modes.BENCHMARK_NAMES
    assert modes.BENCHMARK_NAMES == ("esync", "sync", "async", "dcasgd", "local")


@pytest.mark.parametrize("args, folder", [
    (("sync", 0, 0), "sync"), (("async", 1, 0), "dcasgd"), (("async", 2, 0), "dcasgd-mxnet"), (("async", 1, 1), "dcasgd-niid"),
    (("esync", 0, 2), "esync-niid-shuffled"), (("local", 0, 1), "local-niid")])
def test_folder_names_follow_mode_and_split(args, folder):
    assert mode_dir_name(*args) == folder


def test_mode_dir_of_a_namespace():
    args = Namespace(log_dir="logs", network="lenet", mode="async", use_dcasgd=1,
                     split_by_class=1)
    assert runlayout.mode_dir(args) == Path("logs/lenet/dcasgd-niid")


@pytest.mark.parametrize("folder, label", [
    ("dcasgd", "DC-ASGD"), ("sync-niid", "SSGD (non-i.i.d.)"),
    ("esync-niid-shuffled", "ESync (non-i.i.d., shuffled)"), ("mystery", "mystery")])
def test_labels_come_from_the_registry(folder, label):
    assert modes.label(folder) == label


def test_longest_split_suffix_wins_when_parsing_a_folder():
    assert modes.parse_folder("sync-niid-shuffled") == ("sync", modes.split(2))


def test_variant_rows_belong_to_their_mode():
    assert [modes.family(n) for n in ("esync-fednova-niid", "esync", "local", "foo-bar")] == [
        "esync", "esync", "local", "foo-bar"]


def test_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="choose one of: esync, sync, async, local"):
        algorithm_class("fast")
