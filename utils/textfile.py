"""The one reader of user-given text files (and JSON files) for every CLI.

A binary file, a folder or a missing file is one line naming the flag, the path and, for bytes that are not
UTF-8, the byte offset, the same words prepare_data.py uses for its inputs (utils.documents builds its
message here too).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from utils.errors import PiconeoxError


def not_utf8(path: str | Path, offset: int, error: UnicodeDecodeError) -> str:
    """The message for undecodable bytes at `offset` (the file offset of the decoded chunk) of `path`."""
    return f"{path}: not UTF-8 at byte {offset + error.start} ({error.reason})"


def read_text(path: str | Path, flag: str) -> str:
    """The text of a UTF-8 file (a byte-order mark dropped); one line for anything else."""
    path = Path(path)
    if path.is_dir():
        raise PiconeoxError(f"{flag} {path} is a folder, not a text file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PiconeoxError(f"{flag} {path}: no such file") from None
    except OSError as e:
        raise PiconeoxError(f"{flag} {path}: cannot read it ({e.strerror})") from None
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise PiconeoxError(f"{flag} {not_utf8(path, 0, e)}: give a text file") from None


def read_json(path: str | Path, what: str) -> dict:
    """A JSON object from `path` (`what` says whose file it is); one line naming the file when it is not one."""
    text = read_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PiconeoxError(f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(data, dict):
        raise PiconeoxError(f"{what} {path} is not a JSON object")
    return data


# C0 and C1 controls and DEL, but not newline and tab (they are layout): ESC sequences could move the cursor,
# clear the screen or retitle the window when a prompt or a sampled byte is echoed raw.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character except newline and tab written as a Python escape (\\x1b)."""
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
