"""What the training thread hands the saver thread (`SaveRequest`) and what comes back (`SaveResult`): the two
sides of utils/ckpt/uploader.py's queue, which the checkpointer builds and reads."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from utils.ckpt.state import Snapshot


def save_kind(weights_only: bool) -> str:
    """The queue slot a save takes: at most one request of each kind waits in the queue ("full": a step
    checkpoint; "weights": best/)."""
    return "weights" if weights_only else "full"


@dataclass
class SaveRequest:
    """A captured checkpoint to persist.

    snapshot: the state, already on the CPU (`Registry.capture`).
    folder: the local destination, e.g. checkpoints/<run>/step-00000100 or checkpoints/<run>/best.
    weights_only: best/: weights only, kept local (not uploaded, not rotated).
    """

    snapshot: Snapshot
    folder: Path
    weights_only: bool = False

    @property
    def kind(self) -> str:
        """Its queue slot (`save_kind`): at most one request of each kind waits in the queue."""
        return save_kind(self.weights_only)


@dataclass
class SaveResult:
    """What became of one SaveRequest; `poll()` reports each exactly once.

    error: None on success, else one line saying which phase failed and why.
    uploaded_to: the remote folder holding this checkpoint complete, else None (no bucket, or best/).
    seconds: time from the start of the write to the end of the upload and pruning.
    note: what else the log should say about it.
    """

    folder: Path
    step: int
    error: str | None = None
    uploaded_to: str | None = None
    seconds: float = 0.0
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None
