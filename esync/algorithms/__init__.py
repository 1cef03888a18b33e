"""Synchronization algorithms, one per module, chosen by the ``-m`` value (and ``-dcasgd``)."""
from esync.algorithms.base import Algorithm, AlgorithmConfig, Worker

MODES = ("esync", "sync", "async", "local")


def algorithm_class(mode: str, use_dcasgd: int = 0) -> type[Algorithm]:
    """Import lazily: ESync needs the HTTP client, the others do not."""
    if mode == "esync":
        from esync.algorithms.esync import ESync
        return ESync
    if mode == "sync":
        from esync.algorithms.sync import SyncSGD
        return SyncSGD
    if mode == "async":
        from esync.algorithms.async_ import DCASGD, AsyncSGD
        return DCASGD if use_dcasgd else AsyncSGD
    if mode == "local":
        from esync.algorithms.local import Standalone
        return Standalone
    raise ValueError(f"unknown mode {mode!r}; choose one of: {', '.join(MODES)}")


def mode_dir_name(mode: str, use_dcasgd: int = 0, split_by_class: int = 0) -> str:
    """Log folder of a mode, as the original's analysis tools expect (``dcasgd``, ``-niid``)."""
    name = "dcasgd" if (mode == "async" and use_dcasgd) else mode
    return name + ("-niid" if split_by_class else "")


__all__ = ["Algorithm", "AlgorithmConfig", "Worker", "MODES", "algorithm_class", "mode_dir_name"]
