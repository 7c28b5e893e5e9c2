"""CRC32C of files, a cache of them keyed by size and mtime, and the base64 big-endian form GCS uses."""
from __future__ import annotations

import base64
import os
from pathlib import Path

import google_crc32c

from utils.atomic import atomic_write_json
from utils.errors import PiconeoxError
from utils.textfile import read_json

CHUNK = 1 << 20  # 1 MiB: bounded memory for multi-GB shards and checkpoints
INDEX_NAME = ".crc32c-index.json"  # a folder's CrcIndex: kept by the sync, the dataset checks and prepare_data.py


def crc32c_file(path: str | os.PathLike) -> int:
    """CRC32C of a file's bytes, streamed in 1 MiB chunks."""
    crc = google_crc32c.Checksum()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc.update(chunk)
    return int.from_bytes(crc.digest(), "big")


def crc32c_b64(value: int) -> str:
    """Encode a CRC32C as GCS does: 4 big-endian bytes, base64."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


def crc32c_from_b64(text: str) -> int:
    """Decode a GCS base64 CRC32C back to an int."""
    raw = base64.b64decode(text)
    if len(raw) != 4:
        raise ValueError(f"a crc32c must be 4 bytes, got {len(raw)} from {text!r}")
    return int.from_bytes(raw, "big")


class CrcIndex:
    """crc32c of local files, reused while a file's size and mtime are unchanged.

    Stored as JSON {relative name: [size, mtime_ns, crc32c]}; a missing or unreadable index only
    costs re-hashing, so it is rebuilt rather than reported. Like rsync's quick check, a rewrite that
    keeps both size and mtime goes unnoticed: delete the index file to force a full re-hash.
    """

    def __init__(self, path: Path):
        self.path = path
        self._entries: dict[str, list[int]] = {}
        self._changed = False
        try:  # bounded like every JSON a folder brings: a planted 10 GB index is re-hashing, not an OOM
            self._entries = read_json(path) if path.exists() else {}
        except PiconeoxError:
            pass

    def crc32c(self, rel: str, file: Path, st: os.stat_result) -> int:
        """The crc32c of `file` (stat result `st`), from the index when still valid, else computed."""
        entry = self._entries.get(rel)
        if isinstance(entry, list) and len(entry) == 3 and entry[:2] == [st.st_size, st.st_mtime_ns]:
            return entry[2]
        crc = crc32c_file(file)
        self.record(rel, st, crc)
        return crc

    def record(self, rel: str, st: os.stat_result, crc: int) -> None:
        """Remember a crc32c known to belong to the file content with stat result `st`."""
        self._entries[rel] = [st.st_size, st.st_mtime_ns, crc]
        self._changed = True

    def save(self) -> None:
        if self._changed:
            atomic_write_json(self.path, self._entries)
            self._changed = False
