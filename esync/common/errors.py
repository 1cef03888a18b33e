"""Errors a user can fix, and the one place that turns them into a one-line message.

A module's own error class (bad data, an unwritable log folder, a foreign checkpoint, an
unknown network, an unreachable state server) derives from ``UserError``; ``guarded`` prints
such an error as one ``error:`` line and returns exit code 2, while a programming error keeps
its traceback. This module imports nothing of the project, so every module can use it.
"""
import sys


class UserError(Exception):
    """Something the user can fix (a flag, a file, a folder, a server): reported as one line."""


class UsageError(UserError):
    """A bad flag, environment variable or machine capability, reported as one line."""


def guarded(fn, prog: str = "main.py") -> int:
    """Run `fn`, turning the errors a user can fix into one ``error:`` line and exit code 2."""
    try:
        return fn()
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return 2
