"""The checkout itself: what git ignores, and that the repository stands alone."""
import functools
import re
import subprocess
from pathlib import Path

import pytest

from support import REPO


@pytest.mark.parametrize("leftover", ["state_server/db.sqlite3", "state_server/db.sqlite3-wal",
                                      "state_server/db.sqlite3-shm", "data"])
def test_files_a_run_leaves_in_the_checkout_are_ignored_by_git(leftover):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "check-ignore", "-q", "--no-index", leftover], cwd=REPO,
                          timeout=60)
    assert done.returncode == 0, f"{leftover} would show as untracked; add it to .gitignore"


# ("/shared/esync-logs" in examples is a shared file system, not a document: not matched)
OUTSIDE_DOCS = re.compile(r"\.\./shared|/work/shared|shared/(?:ESYNC|DESIGN|STYLE|README)\b"
                          r"|\b(?:ESYNC|DESIGN|STYLE)\.md\b")
NOT_SOURCE = {".git", ".venv", "logs", "data", "__pycache__", ".pytest_cache"}


def test_no_file_points_to_documents_outside_the_repository():
    """Readers of a fresh clone have docs/ only: no references to a ../shared folder."""
    hits = []
    for path in sorted(REPO.rglob("*")):
        rel = path.relative_to(REPO)
        if (not path.is_file() or NOT_SOURCE & set(rel.parts) or path == Path(__file__)
                or path.suffix in {".png", ".pyc", ".gz", ".npz", ".sqlite3"}):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE_DOCS.search(line):
                hits.append(f"{rel}:{number}: {line.strip()}")
    assert hits == [], "\n".join(hits)


# Every page written by hand: the READMEs and docs/ but the benchmark's generated reports.
HAND_WRITTEN_DOCS = ["README.md", "state_server/README.md"] + sorted(
    str(path.relative_to(REPO)) for path in (REPO / "docs").rglob("*.md")
    if not path.parent.name.startswith("benchmark"))
GENERATED_AT_BUILD = REPO / "docs" / "reference"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def github_slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def is_fence(line):
    return line.lstrip().startswith("```")


HTML_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')


def anchors(markdown):
    """Every heading's anchor, and the ids of `<a id="..."></a>` lines (an alias kept for a link
    written before a heading was renamed)."""
    seen, found = {}, set()
    in_code = False
    for line in markdown.splitlines():
        if is_fence(line):
            in_code = not in_code
        elif not in_code and HTML_ANCHOR.fullmatch(line.strip()):
            found.add(HTML_ANCHOR.fullmatch(line.strip()).group(1))
        elif not in_code and re.match(r"#{1,6} ", line):
            slug = github_slug(line.lstrip("#"))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


@functools.lru_cache(maxsize=None)
def anchors_of(path):
    return anchors(path.read_text())


def test_github_slug_matches_githubs_rule():
    assert github_slug(" The default benchmark (3 repeats, 2026-11-27, night)") == \
        "the-default-benchmark-3-repeats-2026-11-27-night"
    assert github_slug(" Rank 0's writes off the `training` thread") == \
        "rank-0s-writes-off-the-training-thread"
    assert anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}
    assert anchors('<a id="old-name"></a>\n\n## New name\n') == {"old-name", "new-name"}


@pytest.mark.parametrize("document", HAND_WRITTEN_DOCS)
def test_relative_links_and_anchors_in_the_docs_resolve(document):
    """A reader who follows a link lands on a file that exists, at a heading that exists."""
    source = REPO / document
    broken = []
    for target in LINK.findall(source.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s) and mailto links are not checked offline
        path_part, _, anchor = target.partition("#")
        linked = (source.parent / path_part).resolve() if path_part else source
        if GENERATED_AT_BUILD in linked.parents:
            continue  # the command reference: written by the site's build (tests/test_docs.py)
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors_of(linked):
            broken.append(f"{target}: no heading with that anchor in {linked.name}")
    assert broken == [], f"{document}:\n" + "\n".join(broken)


@pytest.mark.parametrize("document", HAND_WRITTEN_DOCS)
def test_every_code_fence_in_the_docs_is_closed(document):
    """An unclosed fence turns the rest of the page into one code block (the README's
    Kubernetes example once swallowed the two sections after it)."""
    fences = [number for number, line in
              enumerate((REPO / document).read_text().splitlines(), 1)
              if is_fence(line)]
    assert len(fences) % 2 == 0, f"{document}: an odd number of ``` lines, at {fences}"
