"""The documentation: the site builds strictly, its reference lists every flag, docs/ stays lean.

The site is MkDocs with the Material theme (``mkdocs.yml``); ``mkdocs build --strict`` fails on
a broken link or anchor and on a page outside the nav. The command reference is generated from
the parsers at build time by ``docs/hooks/reference.py``.
"""
import importlib.util
import os
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

from support import REPO

HOOK = REPO / "docs" / "hooks" / "reference.py"
README_MOST_LINES = 250
DOCS_MOST_BYTES = 10 * 1024 * 1024
DOCS_MOST_FILES = 400
EVIDENCE_REPORTS_AT_MOST = 15           # besides the canonical reports (CANONICAL_REPORTS)
# esync-benchmark; with --gap-sweep; with --testbed esync-journal
CANONICAL_REPORTS = ("benchmark", "benchmark-sweep", "benchmark-journal")
REPORT_FILES = re.compile(r"report\.md|benchmark\.json|figures/[^/]+\.png")


def load_hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it (into a temporary folder)."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return site


def test_the_site_builds_strictly_with_every_page_in_the_nav(built_site):
    assert (built_site / "index.html").exists()


def page_text(site, page):
    html = (site / Path(page).with_suffix("") / "index.html").read_text()
    return unescape(re.sub(r"<[^>]+>", "", html))


def test_every_console_script_and_main_py_has_a_reference_page(built_site):
    hook = load_hook()
    missing = [command for command, _ in hook.commands()
               if not (built_site / Path(hook.page_name(command)).with_suffix("")
                       / "index.html").exists()]
    assert missing == []


def test_the_reference_lists_every_option_of_every_parser(built_site):
    """The generated pages against the parsers themselves: a flag missing from its page fails."""
    hook = load_hook()
    missing = []
    for command, entry in hook.commands():
        text = page_text(built_site, hook.page_name(command))
        for _, action in hook.documented_actions(hook.parser_of(entry)):
            for option in action.option_strings or [action.metavar or action.dest]:
                if option not in text:
                    missing.append(f"{command}: {option}")
    assert missing == []


def test_the_reference_comes_from_the_parser_it_names():
    """esync-cluster's page is built from the launcher's own parser (not a copy of main.py's)."""
    hook = load_hook()
    entries = dict(hook.commands())
    from esync.launch.flags import build_parser
    cluster_only = {o for a in build_parser()._actions for o in a.option_strings} - \
        {o for a in hook.parser_of(entries["main.py"])._actions for o in a.option_strings}
    page = hook.page("esync-cluster", entries["esync-cluster"])
    assert cluster_only and all(f"`{option}" in page for option in cluster_only)


def test_the_readme_is_short_and_has_no_dated_heading():
    lines = (REPO / "README.md").read_text().splitlines()
    dated = [line for line in lines if line.startswith("#") and re.search(r"\b20\d\d-\d\d", line)]
    assert (len(lines) <= README_MOST_LINES, dated) == (True, [])


def test_the_readme_shows_the_ssh_backends_flags_and_how_to_serve_the_docs():
    readme = (REPO / "README.md").read_text()
    assert all(text in readme for text in ("--backend ssh --hostfile hosts.txt", "-ld /shared",
                                           "-dd /shared", ".venv/bin/mkdocs serve",
                                           "bash scripts/run.sh", "bash scripts/test.sh"))


def test_docs_stays_under_its_size_and_file_count():
    files = [p for p in (REPO / "docs").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    assert (sum(p.stat().st_size for p in files) < DOCS_MOST_BYTES,
            len(files) < DOCS_MOST_FILES) == (True, True)


def report_folders():
    return sorted(p for p in (REPO / "docs").iterdir()
                  if p.is_dir() and p.name.startswith("benchmark"))


def test_at_most_fifteen_evidence_reports_beside_the_canonical_ones():
    names = [p.name for p in report_folders()]
    evidence = [n for n in names if n not in CANONICAL_REPORTS]
    assert ("benchmark" in names, len(evidence) <= EVIDENCE_REPORTS_AT_MOST) == (True, True)


def test_every_report_is_reduced_to_its_report_data_and_png_figures():
    extra = [str(p.relative_to(REPO)) for folder in report_folders() for p in folder.rglob("*")
             if p.is_file() and not REPORT_FILES.fullmatch(str(p.relative_to(folder)))]
    assert extra == []


def test_every_report_kept_is_cited_by_a_hand_written_page():
    pages = [p for p in (REPO / "docs").rglob("*.md")
             if not p.parent.name.startswith("benchmark")]
    cited = "\n".join(p.read_text() for p in pages)
    uncited = [folder.name for folder in report_folders()
               if f"{folder.name}/report.md" not in cited]
    assert uncited == []


def test_every_presets_evidence_names_a_page_and_section_of_the_built_site(built_site):
    """Each preset of esync-cluster says where its measurements are (docs/PAGE.md#SECTION):
    that page must be built and hold that anchor."""
    presets = pytest.importorskip("esync.common.presets")
    broken = []
    for preset in presets.PRESETS:
        page, _, anchor = preset.evidence.partition("#")
        html = built_site / Path(page).relative_to("docs").with_suffix("") / "index.html"
        if not html.exists() or (anchor and f'id="{anchor}"' not in html.read_text()):
            broken.append(f"{preset.name}: {preset.evidence}")
    assert broken == []
