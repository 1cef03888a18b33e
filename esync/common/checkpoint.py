"""Atomic checkpoints of the global model, written by rank 0 and read by the evaluator and resume.

numpy only, no MXNet: the launcher reads them too, to check a --resume and to heal a job.

One ``.npz`` file per checkpoint (``round-00000012.npz``): every parameter by structural name plus
a JSON metadata record (round, elapsed training time, samples, network, the run's config). A file
is written to a temporary name, flushed to disk and renamed, so a reader (or a resume after a
crash) sees either the whole checkpoint or none of it.
"""
import io
import json
import zipfile
from pathlib import Path

import numpy as np

from esync.common.errors import UserError
from esync.common.files import atomic_write_bytes, atomic_write_text

FORMAT = "esync-checkpoint-v1"
DONE_MARKER = "DONE"


class CheckpointError(UserError):
    pass


class CheckpointStore:
    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def path_for(self, round_no: int) -> Path:
        return self.folder / f"round-{round_no:08d}.npz"

    def save(self, round_no: int, arrays: dict, meta: dict, state: dict | None = None) -> Path:
        """`arrays`: the model's parameters; `state`: the algorithm's (e.g. outer momentum)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        state = state or {}
        meta = dict(meta, format=FORMAT, round=round_no, names=list(arrays))
        buf = io.BytesIO()
        np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                 **{f"p:{name}": value for name, value in arrays.items()},
                 **{f"s:{name}": value for name, value in state.items()})
        return atomic_write_bytes(self.path_for(round_no), buf.getvalue(), durable=True)

    def list(self) -> list[Path]:
        return sorted(self.folder.glob("round-*.npz"))

    def load(self, path: Path, *, network: str | None = None,
             shapes: dict | None = None) -> tuple[dict, dict]:
        """Read and validate one checkpoint; `network`/`shapes` reject a foreign one."""
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(z["__meta__"].tobytes().decode())
                arrays = {name[2:]: z[name] for name in z.files if name.startswith("p:")}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError,
                json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint "
                                  f"({exc.__class__.__name__}: {exc}); delete it to go on") from None
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {path} is not an esync checkpoint "
                                  f"(format {meta.get('format')!r})")
        if network is not None and meta.get("network") != network:
            raise CheckpointError(f"checkpoint {path} belongs to network {meta.get('network')!r}, "
                                  f"not {network!r}: point --log-dir at this run's folder")
        if shapes is not None:
            got = {k: tuple(v.shape) for k, v in arrays.items()}
            want = {k: tuple(v) for k, v in shapes.items()}
            if got != want:
                missing = sorted(set(want) - set(got)) or sorted(
                    k for k in want if got.get(k) != want[k])
                raise CheckpointError(f"checkpoint {path} does not match the network "
                                      f"{network!r} (first mismatch: {missing[:3]})")
        return meta, arrays

    def read_state(self, path: Path) -> dict:
        """The algorithm state saved beside the model (empty for a run without any)."""
        try:
            with np.load(path, allow_pickle=False) as z:
                return {name[2:]: z[name] for name in z.files if name.startswith("s:")}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint "
                                  f"({exc.__class__.__name__}: {exc}); delete it to go on") from None

    @staticmethod
    def round_of(path: Path) -> int:
        return int(path.stem.split("-")[1])

    def latest(self, *, at_most: int | None = None,
               **expect) -> tuple[Path, dict, dict] | None:
        """The newest loadable checkpoint (of a round <= ``at_most``, if given); a corrupt newest
        one is an error, not skipped."""
        paths = [p for p in self.list() if at_most is None or self.round_of(p) <= at_most]
        if not paths:
            return None
        meta, arrays = self.load(paths[-1], **expect)
        return paths[-1], meta, arrays

    def mark_done(self, meta: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.folder / DONE_MARKER, json.dumps(meta), durable=True)

    def clear_done(self) -> None:
        (self.folder / DONE_MARKER).unlink(missing_ok=True)

    def is_done(self) -> bool:
        return (self.folder / DONE_MARKER).exists()
