"""CRC32C of files, and the base64 big-endian form GCS uses in object metadata."""
from __future__ import annotations

import base64
import os

import google_crc32c

CHUNK = 1 << 20  # 1 MiB: bounded memory for multi-GB shards and checkpoints


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
