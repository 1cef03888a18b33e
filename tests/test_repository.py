"""The checkout itself: what git ignores, and that the repository stands alone."""
import subprocess

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
