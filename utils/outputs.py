"""Output paths of every CLI: checked before any work, and folders written whole or not at all.

check_output_file: a FILE flag (utils.evaluate --output) whose folder can be written and that is no folder.
check_output_dir: a folder flag (rp2040.export --out, utils.consolidate --out): writable, and either new,
    empty, or this command's own earlier output (`owned`); any other folder is refused, never overwritten.
atomic_dir: the folder is built in a temporary sibling and renamed into place once complete, so a reader
    sees the old folder or the new one, never a mix, and a failure leaves the old one as it was.
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Callable, Iterator

from utils.atomic import check_writable_dir
from utils.errors import PiconeoxError


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
