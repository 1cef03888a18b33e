"""The checkout itself: what git ignores, and that the repository stands alone."""
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
