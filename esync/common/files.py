"""Atomic file writes: a reader sees the old file or the complete new one, never a torn one.

Every file the project writes for someone else to read (round logs, run configs, checkpoints,
evaluation summaries, the data set) goes through here: the bytes go to a uniquely named
temporary file in the target's folder, which then replaces the target in one ``os.replace``.
Concurrent writers of the same path therefore never share a temporary file, and a crash leaves
at most a stray ``.<name>.*.tmp`` beside the target, never a half-written target.

``durable=True`` also fsyncs the file before the rename and the folder after it, so the new
content survives a power cut; use it where losing the write loses work (checkpoints, the data
set), not for files rewritten every round.
"""
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def file_mode() -> int:
    """Permission bits of a new plain file under the current umask (mkstemp would give 0600)."""
    try:
        with open("/proc/self/status") as status:   # reading it leaves the umask untouched
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def atomic_open(path, mode: str = "wb", *, durable: bool = False, encoding: str | None = None,
                perms: int | None = None):
    """Open a temporary file for writing that replaces `path` when the block ends without error.

    For writers that stream (gzip, json.dump, csv); on an exception the target is untouched
    and the temporary file is removed. `perms` (e.g. 0o600 for a secret) replaces the
    umask-derived permission bits; the file never exists with wider ones.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode() if perms is None else perms)
        with os.fdopen(fd, mode, encoding=encoding if mode == "w" else None) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        _fsync_folder(path.parent)


def atomic_write_bytes(path, data: bytes, *, durable: bool = False,
                       perms: int | None = None) -> Path:
    """Replace `path` with `data` atomically; returns the path."""
    with atomic_open(path, "wb", durable=durable, perms=perms) as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path, text: str, *, durable: bool = False, encoding: str = "utf-8",
                      perms: int | None = None) -> Path:
    """Replace `path` with `text` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode(encoding), durable=durable, perms=perms)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (the folder's entry list is data too)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass            # some file systems refuse fsync on folders; the file itself is synced
    finally:
        os.close(fd)
