"""MkDocs hook: the command-line reference, one page per command, built from the parsers.

Every console script of ``pyproject.toml`` (``[project.scripts]``) and ``main.py`` gets a page
``reference/<command>.md`` written at build time from the very ``argparse`` parser the command
runs, so the reference cannot drift from ``--help``. Nothing is written into ``docs/``: the pages
exist only in the build. ``tests/test_docs.py`` checks that every option of every parser is on
its page; a new console script needs its page named in ``mkdocs.yml``'s nav (the strict build
fails on a page outside the nav).

None of these parsers imports MXNet, so the site builds on a machine without it.
"""
import argparse
import importlib
import sys
import tomllib
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAIN_PY = ("main.py", "esync.entry:main")      # the original's entry point, for every role


class _Captured(Exception):
    """Raised from inside ``parse_args`` to hand back the parser a command's main builds."""

    def __init__(self, parser):
        super().__init__(parser.prog)
        self.parser = parser


def commands() -> list[tuple[str, str]]:
    """(command, "module:function") for main.py and every console script, in pyproject's order."""
    with open(REPO / "pyproject.toml", "rb") as handle:
        scripts = tomllib.load(handle)["project"]["scripts"]
    return [MAIN_PY, *scripts.items()]


def page_name(command: str) -> str:
    return "reference/" + command.replace(".", "-") + ".md"


def parser_of(entry: str) -> argparse.ArgumentParser:
    """The parser behind ``module:function``: the module's ``build_parser`` if it has one,
    otherwise the one the function builds, caught as it starts to parse (before it acts)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    module_name, _, function_name = entry.partition(":")
    with warnings.catch_warnings():      # matplotlib's own deprecations, not the docs' concern
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(module_name)
    if hasattr(module, "build_parser"):
        return module.build_parser()

    def capture(parser, *args, **kwargs):
        raise _Captured(parser)

    saved = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = capture
    try:
        getattr(module, function_name)([])
    except _Captured as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_known_args = saved
    raise RuntimeError(f"{entry} returned without parsing a command line; give its module a "
                       "build_parser() for the reference")


def documented_actions(parser: argparse.ArgumentParser):
    """Every action ``--help`` shows, with its group's title."""
    for group in parser._action_groups:
        for action in group._group_actions:
            if action.help is not argparse.SUPPRESS:
                yield group.title, action


def _cell(text) -> str:
    """One table cell: one line, pipes escaped, this checkout's path shown as <repo>."""
    text = " ".join(str(text).split()).replace(str(REPO), "<repo>")
    return text.replace("|", "\\|")


def _names(action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        formatter = argparse.HelpFormatter("x")
        metavar = " " + formatter._format_args(action, action.dest.upper())
    return ", ".join(f"`{option}{metavar}`" for option in action.option_strings)


def _default(action) -> str:
    if (action.default is None or action.default is False or action.nargs == 0
            or action.default == argparse.SUPPRESS or action.required):
        return ""
    return f"`{_cell(action.default)}`"


def _help(parser, action) -> str:
    # the plain formatter: the default has a column of its own, not a "(default: ...)" suffix
    text = argparse.HelpFormatter(parser.prog)._expand_help(action) if action.help else ""
    if action.choices and not isinstance(action.choices, dict):
        if any(str(choice) not in text for choice in action.choices):
            text += " (one of " + ", ".join(f"`{choice}`" for choice in action.choices) + ")"
    return _cell(text)


def page(command: str, entry: str) -> str:
    parser = parser_of(entry)
    lines = [f"# {command}", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    lines += [f"Generated from the parser of `{entry}` when this site was built: the same "
              f"options as `{command} --help`.", "",
              "```text", parser.format_usage().strip(), "```", ""]
    current = None
    for title, action in documented_actions(parser):
        if title != current:
            current = title
            lines += ["", f"## {title}", "",
                      "| option | default | meaning |", "| --- | --- | --- |"]
        lines.append(f"| {_names(action)} | {_default(action)} | {_help(parser, action)} |")
    if parser.epilog:
        lines += ["", _cell(parser.epilog)]
    return "\n".join(lines) + "\n"


def on_files(files, config):
    """Add one generated page per command to the build (mkdocs calls this after it has read
    docs/, before it builds the nav)."""
    from mkdocs.structure.files import File

    for command, entry in commands():
        files.append(File.generated(config, page_name(command), content=page(command, entry)))
    return files
