"""Synchronization algorithms, one per module, chosen by the ``-m`` value (and ``-dcasgd``).

Which class runs which mode is in the mode registry (``esync.common.modes``); these wrappers keep the
older names working.
"""
from esync.common import modes
from esync.worker.algorithms.base import Algorithm, AlgorithmConfig, Worker

MODES = modes.CLI_MODES


def algorithm_class(mode: str, use_dcasgd: int = 0) -> type[Algorithm]:
    """Import lazily: ESync needs the HTTP client, the others do not."""
    return modes.for_cli(mode, use_dcasgd).algorithm_class()


def mode_dir_name(mode: str, use_dcasgd: int = 0, split_by_class: int = 0) -> str:
    """Log folder of a mode, as the original's analysis tools expect (``dcasgd``, ``-niid``)."""
    return modes.folder_name(mode, use_dcasgd, split_by_class)


__all__ = ["Algorithm", "AlgorithmConfig", "Worker", "MODES", "algorithm_class", "mode_dir_name"]
