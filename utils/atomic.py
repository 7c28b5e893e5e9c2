"""Atomic file writes: a reader sees the old file or the complete new one, never half of one.

The data goes to a temporary file in the same directory (so os.replace is a rename on one
filesystem), is fsynced, then renamed over the target. On any exception the temporary file is removed.
check_writable_dir refuses an output folder that cannot be written before any work starts.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import IO, Any, Iterator

from utils.errors import PiconeoxError


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file next to `path` for writing; rename it to `path` on success.

    `mode` is "wb" or "w" (text, UTF-8). The parent directory must exist.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write mode must be 'wb' or 'w', got {mode!r}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    # os.open with 0o666 lets the umask decide permissions, as a plain open() would (mkstemp forces 0600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    with atomic_write(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def check_writable_dir(path: str | os.PathLike, flag: str) -> None:
    """Refuse, in one line, a folder that could not be created or written (a path under a file, a read-only
    place). It leaves nothing behind: it creates and removes a folder in the nearest existing ancestor,
    which also catches what permission bits do not show (read-only mounts, /proc, root squash)."""
    path = Path(path).absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise PiconeoxError(f"{flag} {path}: {existing} is a file, not a folder; choose another path")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=existing))
    except OSError as e:
        raise PiconeoxError(f"{flag} {path}: cannot write in {existing} ({e.strerror}); choose another path") from None
