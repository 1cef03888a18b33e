"""TensorBoard scalars of a job (``--tensorboard DIR``), written with tensorboardX.

    esync-cluster                                     # DIR defaults to the job's log folder
    pip install tensorboard && tensorboard --logdir logs

Two processes write into DIR, each into an event file of its own (tensorboardX's
``events.out.tfevents.*`` with the suffix ``.rank0`` or ``.evaluator``):

* rank 0, once per round (step = round): ``train/loss`` (its mean loss over the round's local
  iterations), ``train/throughput`` (samples per second of the whole cluster),
  ``train/computing_time_ratio`` (its computing seconds / training seconds so far, the analysis'
  meaning) and ``k/worker<i>``, the local iterations k_i of every worker whose k the exchange
  carried (of rank 0 alone where the algorithm does not carry the others');
* the evaluator, once per scored checkpoint: ``test/accuracy_by_round`` (step = round) and
  ``test/accuracy_by_time`` (step = training time in milliseconds: TensorBoard's steps are
  integers).

DIR gets no sub-folders, so TensorBoard shows a job under its folder's name (``lenet/esync`` with
``--logdir logs``), and modes compare side by side. ``read_scalars`` reads the files back.
"""
from __future__ import annotations

import struct
from pathlib import Path

from esync.common.errors import UserError

EVENT_GLOB = "events.out.tfevents.*"
FLUSH_SECONDS = 2          # a live TensorBoard sees a round within seconds

TAG_LOSS = "train/loss"
TAG_THROUGHPUT = "train/throughput"
TAG_COMPUTING_RATIO = "train/computing_time_ratio"
TAG_K = "k/worker{rank}"
TAG_ACCURACY_BY_ROUND = "test/accuracy_by_round"
TAG_ACCURACY_BY_TIME = "test/accuracy_by_time"


class ScalarWriter:
    """One process's event file in ``folder``, created at the first scalar (none if never used)."""

    def __init__(self, folder: str | Path, *, role: str):
        self.folder = Path(folder)
        self.role = role
        self._writer = None

    def add(self, tag: str, value: float, step: int) -> None:
        if self._writer is None:
            from tensorboardX import SummaryWriter
            self.folder.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(str(self.folder), filename_suffix=f".{self.role}",
                                         flush_secs=FLUSH_SECONDS)
        self._writer.add_scalar(tag, float(value), int(step))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def forget_earlier_events(folder: str | Path) -> None:
    """``--overwrite``: an earlier run's curves must not mix with this run's."""
    for path in Path(folder).glob(EVENT_GLOB):
        path.unlink(missing_ok=True)


class TrainingScalars:
    """Rank 0's per-round scalars (see the module docstring)."""

    def __init__(self, folder: str | Path):
        self.out = ScalarWriter(folder, role="rank0")
        self.compute_seconds = 0.0

    def add_round(self, round_no: int, *, loss: float, compute: float, round_seconds: float,
                  samples: int, elapsed: float, worker_ks: dict[int, int]) -> None:
        self.compute_seconds += compute
        self.out.add(TAG_LOSS, loss, round_no)
        if round_seconds > 0:
            self.out.add(TAG_THROUGHPUT, samples / round_seconds, round_no)
        if elapsed > 0:
            self.out.add(TAG_COMPUTING_RATIO, min(1.0, self.compute_seconds / elapsed), round_no)
        for rank, k in sorted(worker_ks.items()):
            self.out.add(TAG_K.format(rank=rank), k, round_no)

    def close(self) -> None:
        self.out.close()


class EvaluationScalars:
    """The evaluator's test accuracy, against round and against training time."""

    def __init__(self, folder: str | Path):
        self.out = ScalarWriter(folder, role="evaluator")

    def add_score(self, round_no: int, *, training_seconds: float, accuracy: float) -> None:
        self.out.add(TAG_ACCURACY_BY_ROUND, accuracy, round_no)
        self.out.add(TAG_ACCURACY_BY_TIME, accuracy, round(training_seconds * 1000))

    def close(self) -> None:
        self.out.close()


class EventFileError(UserError):
    """An event file that is not a sequence of intact TFRecord records."""


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of every event file in ``folder``: ``{tag: [(step, value), ...]}`` by step.

    Reads the TFRecord framing itself (length, masked CRC-32C of the length, event, masked CRC of
    the event) and checks both checksums; a damaged file raises EventFileError.
    """
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(folder).glob(EVENT_GLOB)):
        for event in _events(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return {tag: sorted(points) for tag, points in scalars.items()}


def _events(path: Path):
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c

    data = path.read_bytes()
    offset = 0
    while offset < len(data):
        if len(data) - offset < 12:
            raise EventFileError(f"{path}: truncated record header at byte {offset}")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        body = data[offset + 12:offset + 12 + length]
        end = offset + 12 + length + 4
        if header_crc != masked_crc32c(header) or end > len(data):
            raise EventFileError(f"{path}: damaged record at byte {offset}")
        (body_crc,) = struct.unpack("<I", data[end - 4:end])
        if body_crc != masked_crc32c(body):
            raise EventFileError(f"{path}: checksum mismatch in the record at byte {offset}")
        event = Event()
        event.ParseFromString(body)
        yield event
        offset = end
