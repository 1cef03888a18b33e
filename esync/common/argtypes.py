"""Argument types and the parser every command of the project shares.

``main.py``, ``esync-cluster``, ``esync-benchmark``, the summary and the drawer all reject a bad
value the same way: one ``error:`` line naming the flag and what it must be, never a traceback
(``UsageParser`` raises ``UsageError`` instead of exiting, so each command prints it its way).
"""
import argparse
import math

from esync.common.errors import UsageError


class UsageParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are ``UsageError`` (message + where to look)."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except for required options, flags and options without one."""

    def _get_help_string(self, action):
        if action.required or action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def typed(kind, text, what):
    """``kind(text)``, or an argparse error saying what the value must be."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def bounded_number(kind, *, low, strict=False, high=None, must):
    """An argparse type: a finite number of ``kind`` within bounds, else 'must be <must>, got <text>'."""
    what = "an integer" if kind is int else "a number"

    def parse(text):
        value = typed(kind, text, what)
        above = value > low if strict else value >= low
        if not (above and (high is None or value <= high) and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be {must}, got {text}")
        return value
    return parse


def slowdown_factors(text: str, workers: int) -> list[float]:
    """``--slowdown``: one factor >= 1 per worker (or one for all), e.g. ``1,1,4,8``."""
    try:
        values = [float(t) for t in text.split(",")]
    except ValueError:
        raise UsageError(f"argument --slowdown: {text!r} is not a comma-separated list of "
                         "numbers") from None
    if len(values) == 1:
        values *= workers
    if len(values) != workers:
        raise UsageError(f"argument --slowdown: {len(values)} factors for {workers} workers "
                         "(give one per worker, or one for all)")
    if any(not (v >= 1 and math.isfinite(v)) for v in values):
        raise UsageError(f"argument --slowdown: factors must be numbers >= 1, got {text!r}")
    return values


positive_int = bounded_number(int, low=0, strict=True, must="a positive integer")
non_negative_int = bounded_number(int, low=0, must="an integer >= 0")
positive_float = bounded_number(float, low=0, strict=True, must="a positive number")
non_negative_float = bounded_number(float, low=0, must=">= 0")
positive_seconds = bounded_number(float, low=0, strict=True, must="a positive number of seconds")
port = bounded_number(int, low=1, high=65535, must="a port number 1-65535")
fraction = bounded_number(float, low=0, high=1, must="between 0 and 1")
