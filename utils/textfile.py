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


def read_text(path: str | Path, flag: str, max_bytes: int | None = None) -> str:
    """The text of a UTF-8 file (a byte-order mark dropped); one line for anything else, or for a file over
    `max_bytes`."""
    path = Path(path)
    label = f"{flag} {path}".lstrip()
    if path.is_dir():
        raise PiconeoxError(f"{label} is a folder, not a text file")
    try:
        if max_bytes is not None and (size := path.stat().st_size) > max_bytes:
            raise PiconeoxError(f"{label}: {size:,} bytes, more than the {max_bytes:,} allowed for this file")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PiconeoxError(f"{label}: no such file") from None
    except OSError as e:
        raise PiconeoxError(f"{label}: cannot read it ({e.strerror})") from None
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise PiconeoxError(f"{flag} {not_utf8(path, 0, e)}: give a text file".lstrip()) from None


# What a JSON file may cost: parsing takes up to ~28x its size in memory (64 MiB of `[{},...]`: 1.8 GB), so each kind
# has the cap its honest files need with room to spare. Small states (a marker, a config, a part, an RNG state, an
# index) are a few KB: SMALL_JSON_BYTES. tokenizer.json (Pythia's: 2 MB), manifests of MAX_SHARDS shards, the crc
# index and metrics history: MAX_JSON_BYTES.
MAX_JSON_BYTES = 16 << 20
SMALL_JSON_BYTES = 1 << 20


def read_json(path: str | Path, what: str = "", max_bytes: int = MAX_JSON_BYTES) -> dict:
    """A JSON object from `path` (`what` says whose file it is); one line naming the file when it is not one,
    is larger than `max_bytes`, nests too deep to parse (json recurses: 100,000 brackets are a RecursionError), or
    holds an integer of more than 4,300 digits (Python refuses to convert it)."""
    text = read_text(path, what, max_bytes)
    label = f"{what} {path}".lstrip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PiconeoxError(f"{label} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise PiconeoxError(f"{label} is not valid JSON (nested too deep to read)") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
        raise PiconeoxError(f"{label}: a number there is too long to read ({str(e).split(';')[0][:100]})") from None
    if not isinstance(data, dict):
        raise PiconeoxError(f"{label} is not a JSON object")
    return data


# C0 and C1 controls and DEL, but not newline and tab (they are layout): ESC sequences could move the cursor,
# clear the screen or retitle the window when a prompt or a sampled byte is echoed raw.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character except newline and tab written as a Python escape (\\x1b)."""
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
