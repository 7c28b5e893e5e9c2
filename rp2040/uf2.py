"""Refuse, before the emulator starts, a --firmware that is not an RP2040 UF2 image.

UF2 (https://github.com/microsoft/uf2): 512-byte blocks, each with two start magics, an end magic and, when
flag 0x2000 is set, a family id; the RP2040's is 0xE48BFF56. A text file or an image for another chip would
otherwise boot nothing and leave the emulated board silent until the wall-clock limit.
"""
from __future__ import annotations

import struct
from pathlib import Path

from utils.errors import PiconeoxError

BLOCK = 512
MAGIC_START0, MAGIC_START1, MAGIC_END = 0x0A324655, 0x9E5D5157, 0x0AB16F30
FLAG_FAMILY_ID = 0x2000
RP2040_FAMILY = 0xE48BFF56
MAX_PAYLOAD = 476  # a block's data area
FLASH_START, FLASH_SIZE = 0x10000000, 2 << 20  # RPI_PICO: 2 MiB of flash at 0x10000000
WHERE = "a RPI_PICO MicroPython .uf2 (https://micropython.org/download/RPI_PICO/)"


def check_uf2(path: Path, flag: str = "--firmware") -> None:
    """One line unless every block of `path` is a UF2 block for the RP2040 family whose fields hold together: a
    payload of at most 476 bytes inside the Pico's flash, block numbers below a block count that matches the file."""
    data = Path(path).read_bytes()
    if not data or len(data) % BLOCK:
        raise PiconeoxError(f"{flag} {path} is not a UF2 image ({len(data):,} bytes, not a multiple of {BLOCK}); "
                            f"give {WHERE}")
    for offset in range(0, len(data), BLOCK):
        start0, start1, flags = struct.unpack_from("<III", data, offset)
        address, size, number, count, family = struct.unpack_from("<5I", data, offset + 12)
        (end,) = struct.unpack_from("<I", data, offset + BLOCK - 4)
        if (start0, start1, end) != (MAGIC_START0, MAGIC_START1, MAGIC_END):
            raise PiconeoxError(f"{flag} {path} is not a UF2 image (no UF2 magic in block {offset // BLOCK}); "
                                f"give {WHERE}")
        if not flags & FLAG_FAMILY_ID or family != RP2040_FAMILY:
            raise PiconeoxError(f"{flag} {path} is a UF2 image for another chip (family id {family:#010x}, the "
                                f"RP2040's is {RP2040_FAMILY:#010x}); give {WHERE}")
        if lie := block_lie(address, size, number, count, len(data) // BLOCK):
            raise PiconeoxError(f"{flag} {path} is a damaged UF2 image: block {offset // BLOCK} has {lie}; "
                                f"give {WHERE}")


def block_lie(address: int, size: int, number: int, count: int, blocks: int) -> str | None:
    """What a block's fields say that cannot be (the emulator would fail on it with a stack trace), or None."""
    if size > MAX_PAYLOAD:
        return f"a payload of {size} bytes (at most {MAX_PAYLOAD})"
    if not number < count == blocks:
        return f"block number {number} of {count} in a file of {blocks} blocks"
    if not FLASH_START <= address <= address + size <= FLASH_START + FLASH_SIZE:
        return f"{size} bytes at {address:#010x}, outside the Pico's {FLASH_SIZE >> 20} MiB of flash"
    return None
