"""esync.common.files: every file the project writes appears whole or not at all."""
import os
import re
import stat
from pathlib import Path

import pytest

from esync.common.files import atomic_open, atomic_write_bytes, atomic_write_text

REPO = Path(__file__).resolve().parents[1]


def test_atomic_write_text_replaces_the_content_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "run.json"
    target.write_text("old")
    atomic_write_text(target, "new ✓")
    assert (target.read_text(encoding="utf-8"), sorted(p.name for p in tmp_path.iterdir())) \
        == ("new ✓", ["run.json"])


def test_atomic_write_bytes_durable_writes_the_bytes(tmp_path):
    target = tmp_path / "round-1.npz"
    atomic_write_bytes(target, b"\x00\x01" * 1000, durable=True)
    assert target.read_bytes() == b"\x00\x01" * 1000


def test_a_failing_writer_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("complete old summary")
    with pytest.raises(RuntimeError):
        with atomic_open(target, "w") as f:
            f.write("half of a new sum")
            raise RuntimeError("disk full halfway")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    assert target.read_text() == "complete old summary"


def test_new_files_get_the_umask_permissions_not_mkstemps_0600(tmp_path):
    old = os.umask(0o027)
    try:
        path = atomic_write_text(tmp_path / "iter-1.txt", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_no_module_writes_with_its_own_os_replace():
    """New write sites must use esync.common.files; only moves of finished files may rename directly."""
    allowed = {"esync/common/files.py", "esync/worker/prepare.py"}   # prepare moves downloads in
    offenders = [str(p.relative_to(REPO)) for p in REPO.rglob("*.py")
                 if ".venv" not in p.parts and "tests" not in p.parts
                 and re.search(r"\bos\.(replace|rename)\(", p.read_text(encoding="utf-8"))
                 and str(p.relative_to(REPO)) not in allowed]
    assert offenders == []


def test_perms_gives_a_secret_owner_only_bits_whatever_the_umask(tmp_path):
    path = atomic_write_text(tmp_path / "secret.yaml", "token: x", perms=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
