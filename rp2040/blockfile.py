"""model.blk: an int8 v4 model.bin laid out over littlefs's blocks, for weights read in place from the flash
filesystem when they are too large for the raw gap before it (the layout: rp2040/runtime/lfsblocks.py)."""
from __future__ import annotations

import struct
import zlib

from rp2040.runtime import modelfile as mf
from rp2040.runtime.lfsblocks import LFS_BLOCK, LFS_BLOCKS, TAG, TAG_BYTES, matrices, plan, pointers

# littlefs's own blocks beside the file: the root and /model metadata pairs, the runtime, vocab.bin, main.py
# and config.json, with room for an install's staging copy of the small files (rp2040/flash.py checks space).
OTHER_BLOCKS = 48


def spec(model_bin: bytes) -> dict | None:
    """config.json's runtime["blocks"] when the board can read this model.bin in place from littlefs blocks
    (int8 v4, every matrix interleaved, a 4-row group under a block, the file within littlefs), else None."""
    h = mf.Header(model_bin[:mf.HEADER_SIZE])
    lay = mf.Layout(h)
    if not h.blocked or not all(h.interleaved(r, c) for _, r, c in matrices(h, lay)):
        return None
    try:
        _, count, _ = plan(h, lay)
    except mf.FormatError:
        return None
    if count + OTHER_BLOCKS > LFS_BLOCKS:
        return None
    return {"crc32": int.from_bytes(model_bin[-4:], "little"), "prefix_crc32": zlib.crc32(model_bin[:lay.w_offset]),
            "blocks": count}


def block_file(model_bin: bytes) -> bytes:
    """model.blk's bytes: the header and P, then each littlefs block of the file: tag and whole 4-row groups."""
    h = mf.Header(model_bin[:mf.HEADER_SIZE])
    lay = mf.Layout(h)
    first, _, mats = plan(h, lay)
    out = bytearray(model_bin[:lay.w_offset])
    out += bytes(sum(LFS_BLOCK - pointers(n) for n in range(first)) - len(out))
    w = model_bin[lay.w_offset:lay.end]
    model_crc = model_bin[-4:]
    for w_off, _, n_in, chunks in mats:
        for n, r0, rows in chunks:
            data = w[w_off + r0 * n_in:w_off + (r0 + rows) * n_in]
            data += bytes(LFS_BLOCK - pointers(n) - TAG_BYTES - len(data))
            out += TAG + model_crc + struct.pack("<II", n, zlib.crc32(data)) + data
    return bytes(out)
