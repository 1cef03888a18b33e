"""Analysis of training logs: ``summary`` (logs -> JSON), ``drawer`` (JSON -> figures), ``table``.

No MXNet here: analysis runs anywhere, fast. ``drawer`` imports matplotlib, so it is not imported
by this package; import ``esync.analysis.drawer`` where figures are needed.
"""
from esync.analysis.summary import LogError, collect, summarize, summary_name, write_summary

__all__ = ["LogError", "collect", "summarize", "summary_name", "write_summary"]
