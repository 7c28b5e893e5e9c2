"""The refusal every check of untrusted bytes raises when a file asks for more than a checkpoint may hold: at the
bottom of the room, so that each check (`safe_load`, `index_check`) imports it and none imports another for it."""
from __future__ import annotations

from utils.errors import PiconeoxError


class UnsafeCheckpoint(PiconeoxError):
    """A checkpoint file asks for something a checkpoint may not contain (code, or objects that could run it)."""


def refusal(path, what: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(f"{path}: refused to load: it asks for {what}, which a checkpoint may not contain "
                            "(only tensors, numbers, strings and checkpoint metadata); loading a checkpoint never "
                            "runs code from it")
