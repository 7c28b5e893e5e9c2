"""Atomic file writes: a reader sees the old file or the complete new one, never half of one.

The data goes to a temporary file in the same directory (so os.replace is a rename on one
filesystem), is fsynced, then renamed over the target. On any exception the temporary file is removed.
check_writable_dir refuses an output folder that cannot be written before any work starts.

Output paths of every CLI: checked before any work, and folders written whole or not at all.

check_output_file: a FILE flag (utils.evaluate --output) whose folder can be written and that is no folder.
check_output_dir: a folder flag (rp2040.export --out, utils.consolidate --out): writable, and either new,
    empty, or this command's own earlier output (`owned`); any other folder is refused, never overwritten.
atomic_dir: the folder is built in a temporary sibling and renamed into place once complete, so a reader
    sees the old folder or the new one, never a mix, and a failure leaves the old one as it was.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import IO, Any, Callable, Iterator

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


def check_output_file(path: str | Path, flag: str) -> Path:
    """`path` when a file can be written there (its folder created if need be); else one line."""
    path = Path(path)
    if path.is_dir():
        raise PiconeoxError(f"{flag} {path} is a folder: give a file name, e.g. {path / 'results.json'}")
    folder = path.absolute().parent
    try:
        check_writable_dir(folder, flag)
    except PiconeoxError as e:  # name the file the user gave, not only its folder
        raise PiconeoxError(str(e).replace(f"{flag} {folder}", f"{flag} {path}", 1)) from None
    return path


def check_output_dir(path: str | Path, flag: str, owned: Callable[[Path], bool], what: str) -> Path:
    """`path` when it can be written and is new, empty, or `owned` (this command's output, `what`)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PiconeoxError(f"{flag} {path} is a file, not a folder; choose another path")
    check_writable_dir(path, flag)
    if path.is_dir() and any(path.iterdir()) and not owned(path):
        names = sorted(p.name for p in path.iterdir())
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise PiconeoxError(f"{flag} {path} holds other files ({shown}), not {what}: choose a new or empty folder")
    return path


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder beside `path`; on success it replaces `path`, else it is removed.

    The siblings have fixed names (.NAME.tmp, .NAME.old), so what a killed write left is removed by the next one."""
    path = Path(path)
    tmp, old = path.with_name(f".{path.name}.tmp"), path.with_name(f".{path.name}.old")
    for leftover in (tmp, old):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
