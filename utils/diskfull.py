"""A full disk as one line: which folder, what needed how much, what is free.

Writers that can meet a full disk (checkpoint shards, best/ and final/, logs, TensorBoard, the loss plot, prepared
data) call `check_space` before a write whose size they know, and turn a failed write into `DiskFull` with
`raise_if_full`. torch's zip writer reports ENOSPC as "unexpected pos", and DCP wraps it in a BaseException, so a
failure also counts as a full disk when the folder has less free space than the write needed.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

from utils.errors import PiconeoxError

NO_SPACE = "no space left in"  # every DiskFull message starts with it (the uploader stops the run on it)

ALMOST_FULL = 2**20  # a failed write of unknown size with less than this free beside it met a full disk (numpy's
# short writes and torch's zip writer do not say ENOSPC)


class DiskFull(PiconeoxError):
    """The folder's filesystem is full (or over quota): the run ends, the last complete checkpoint stays."""


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def free_bytes(folder: str | os.PathLike) -> int | None:
    """Free bytes for an unprivileged writer on `folder`'s filesystem (its nearest existing ancestor)."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def disk_full(folder: str | os.PathLike, what: str, needed: int | None = None) -> DiskFull:
    free = free_bytes(folder)
    size = f" needs about {_mb(needed)}" if needed else " could not be written"
    room = f", {_mb(free)} free" if free is not None else ""
    return DiskFull(f"{NO_SPACE} {folder}: {what}{size}{room}; free some space there or choose another folder")


def check_space(folder: str | os.PathLike, needed: int, what: str) -> None:
    """Refuse a write of `needed` bytes that cannot fit, before it starts (so nothing half-written is left)."""
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise disk_full(folder, what, needed)


def is_no_space(e: BaseException | None) -> bool:
    """ENOSPC or EDQUOT anywhere in `e`, its causes, or the failures a DCP CheckpointException wraps. One walk
    with one `seen` set: a wrapped failure whose context is its wrapper (DCP re-raised in a loader) is a cycle."""
    todo, seen = [e], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e):
            return True
        for wrapped in getattr(e, "failures", {}).values():  # torch.distributed.checkpoint's CheckpointException
            todo.append(wrapped[0] if isinstance(wrapped, tuple) else wrapped)
        todo.append(e.__cause__ or e.__context__)
    return False


def raise_if_full(e: BaseException, folder: str | os.PathLike, what: str, needed: int | None = None) -> None:
    """Raise DiskFull from `e` when it (or the free space left beside it) says the disk is full."""
    free = free_bytes(folder)
    if is_no_space(e) or (free is not None and free < (needed or ALMOST_FULL)):
        raise disk_full(folder, what, needed) from None


@contextlib.contextmanager
def one_line_when_full(folder: str | os.PathLike, what: str, needed: int | None = None) -> Iterator[None]:
    """Inside it, a write that meets a full disk raises DiskFull (one line) instead of its own traceback."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        raise_if_full(e, folder, what, needed)
        raise
