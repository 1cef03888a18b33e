"""The modes in one place: name, log folder, label, colour, algorithm class, summary file name.

Everything that needs to know the modes (the algorithm registry, the trainer's and launcher's log
folder, the summary, the drawer, the speedup table, the benchmark) reads this table, so a new
mode is one line here plus its algorithm module. A log folder is ``<mode><split suffix>``: the
data split (``-s``) adds a suffix (``-niid`` for by-class shards, as the original's analysis
tools expect); a new split is one line in ``SPLITS``.

Plain Python (no MXNet): the analysis tools import it too.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str           # the log folder's base name and the benchmark's row name
    label: str          # what figures and tables show
    colour: str         # matplotlib colour (the original's for ESync, Sync, Async)
    algorithm: str      # "module:Class" of its algorithm, imported on demand
    cli_mode: str       # the -m value that runs it
    dcasgd: int = 0     # the -dcasgd value that runs it
    summary: str = ""   # the original's summary file stem (ESync -> ESync.json)
    cluster: bool = True  # False: one process, no parameter server
    benchmark: bool = True  # in the benchmark's default --modes (False: a variant, on request)
    # --collective values it runs over: "ps" (MXNet's parameter server), "allreduce" (Horovod's
    # ring: only modes whose updates need no server)
    collectives: tuple[str, ...] = ("ps",)

    def algorithm_class(self):
        module, _, cls = self.algorithm.partition(":")
        return getattr(importlib.import_module(module), cls)


@dataclass(frozen=True)
class Split:
    value: int          # the -s value
    suffix: str         # appended to the mode's log folder
    label: str          # appended to the mode's label ("" for i.i.d.)
    summary: str        # appended to the summary file stem
    description: str    # how the training set is split over the workers and fed (-s's help)


MODES: tuple[Mode, ...] = (
    Mode("esync", "ESync", "m", "esync.worker.algorithms.esync:ESync", "esync", summary="ESync",
         collectives=("ps", "allreduce")),
    Mode("sync", "SSGD", "orange", "esync.worker.algorithms.sync:SyncSGD", "sync", summary="Sync",
         collectives=("ps", "allreduce")),
    Mode("async", "ASGD", "b", "esync.worker.algorithms.async_:AsyncSGD", "async", summary="Async"),
    Mode("dcasgd", "DC-ASGD", "g", "esync.worker.algorithms.async_:DCASGD", "async", dcasgd=1,
         summary="DCASGD"),
    Mode("dcasgd-mxnet", "DC-ASGD (MXNet server)", "c",
         "esync.worker.algorithms.async_:MXNetDCASGD", "async", dcasgd=2,
         summary="DCASGD-MXNet", benchmark=False),
    Mode("local", "Standalone SGD", "k", "esync.worker.algorithms.standalone:Standalone", "local",
         summary="Local", cluster=False, collectives=()),
)
# The -s values (``esync.common.dataset.training_shard`` cuts the shards they name).
IID, CLASS_SORTED, CLASS_SORTED_SHUFFLED = 0, 1, 2
SPLITS: tuple[Split, ...] = (
    Split(IID, "", "", "",
          "i.i.d. (a random equal shard per worker, reshuffled every epoch)"),
    Split(CLASS_SORTED, "-niid", "non-i.i.d.", "-Non-IID",
          "non-i.i.d. as in the original (a contiguous block of class-sorted data per worker, "
          "fed in class order without shuffling: nearly single-class batches)"),
    Split(CLASS_SORTED_SHUFFLED, "-niid-shuffled", "non-i.i.d., shuffled", "-Non-IID-Shuffled",
          "milder non-i.i.d. (the same class blocks, reshuffled inside the shard every epoch: "
          "batches mix the worker's classes)"),
)
SPLIT_VALUES = tuple(s.value for s in SPLITS)

NAMES = tuple(m.name for m in MODES)
# ESync's aggregation rules (--aggregation; the maths: esync.worker.algorithms.aggregate) and the
# deltas' types on the wire (--comm-dtype), named here where the CLI and the benchmark can read
# them without importing MXNet.
AGGREGATION_RULES = ("mean", "weighted", "fednova", "sum")
COMM_DTYPES = ("float32", "float16")
BENCHMARK_NAMES = tuple(m.name for m in MODES if m.benchmark)   # the benchmark's default modes
CLI_MODES = tuple(dict.fromkeys(m.cli_mode for m in MODES))   # the -m choices, in order
BASELINE = "sync"           # the speedup's reference
ASYNCHRONOUS_CLI = "async"  # the -m value whose workers' rounds are each their own
STANDALONE = "local"        # one device alone
_BY_NAME = {m.name: m for m in MODES}


def get(name: str) -> Mode:
    """The mode called ``name``; ValueError naming the choices otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; choose one of: {', '.join(NAMES)}") from None


def find(name: str) -> Mode | None:
    return _BY_NAME.get(name)


def for_cli(mode: str, use_dcasgd: int = 0) -> Mode:
    """The mode that ``-m mode -dcasgd use_dcasgd`` runs."""
    for m in MODES:
        if m.cli_mode == mode and (m.dcasgd == int(use_dcasgd) or mode != "async"):
            return m
    raise ValueError(f"unknown mode {mode!r}; choose one of: {', '.join(CLI_MODES)}")


def split(value: int) -> Split:
    for s in SPLITS:
        if s.value == value:
            return s
    raise ValueError(f"unknown data split {value!r}; choose one of: "
                     f"{', '.join(str(s.value) for s in SPLITS)}")


def folder_name(mode: str, use_dcasgd: int = 0, split_by_class: int = 0) -> str:
    """Log folder of ``-m mode -dcasgd D -s S``: ``dcasgd``, ``sync-niid``, ..."""
    return for_cli(mode, use_dcasgd).name + split(split_by_class).suffix


def parse_folder(name: str) -> tuple[str, Split]:
    """``"sync-niid"`` -> ``("sync", <split 1>)``; an unknown base keeps its name, i.i.d."""
    for s in sorted(SPLITS, key=lambda s: -len(s.suffix)):
        if s.suffix and name.endswith(s.suffix):
            return name[: -len(s.suffix)], s
    return name, SPLITS[0]


def label(folder: str) -> str:
    """``"sync-niid"`` -> ``"SSGD (non-i.i.d.)"``; unknown names stay as they are."""
    base, s = parse_folder(folder)
    mode = find(base)
    text = mode.label if mode else base
    return f"{text} ({s.label})" if s.label else text


def family(folder: str) -> str:
    """The registry mode a folder or row name belongs to: ``esync-fednova-niid`` -> ``esync``.

    A name whose base is not a mode but starts with ``<mode>-`` (a benchmark variant) belongs to
    that mode; anything else is its own family.
    """
    base = parse_folder(folder)[0]
    if base in _BY_NAME:
        return base
    head = base.split("-", 1)[0]
    return head if head in _BY_NAME else base


def colour(folder: str, default: str | None = None) -> str | None:
    mode = find(parse_folder(folder)[0])
    return mode.colour if mode else default


def summary_file(folder: str) -> str:
    """The original's summary file name: ``esync-niid`` -> ``ESync-Non-IID.json``."""
    base, s = parse_folder(folder)
    mode = find(base)
    return f"{mode.summary if mode else base}{s.summary}.json"


def sort_key(folder: str) -> tuple:
    """Known modes first in the paper's order, split by split, then the rest by name."""
    base, s = parse_folder(folder)
    known = base in _BY_NAME
    return (not known, s.value, NAMES.index(base) if known else 0, folder)
