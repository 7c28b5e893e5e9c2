"""model.bin read in place from the Pico's memory-mapped flash (XIP): no copy of the weights into RAM.

rp2040.flash writes an int8 model.bin whose weights do not fit the heap raw into the flash gap between the
RPI_PICO firmware (its v1.28 image ends at 0x52f00) and littlefs (0xa0000), through rp2.Flash's blocks before
its first (negative block numbers), and checks it by sha256 there; config.json names its size and CRC-32. The
runtime then reads the 64-byte header and section P from the mapping like a file, and the matrices straight
from their XIP addresses. A region that holds no model, or another model's bytes, is refused in one line.
"""
RAW_OFFSET = 0x53000  # flash offset of the region: the first 4 KiB block after the v1.28 firmware
RAW_END = 0xA0000  # where littlefs starts
RAW_BYTES = RAW_END - RAW_OFFSET  # 315,392
XIP_BASE = 0x10000000
BLOCK = 4096
AGAIN = "flash this model again with python -m rp2040.flash"


class XipFile:
    """A read-only file over `size` bytes of memory at `address`: seek, read, readinto; `mv` is the mapping."""

    def __init__(self, address, size):
        import uctypes

        self.mv = memoryview(uctypes.bytearray_at(address, size))
        self.pos = 0

    def seek(self, pos):
        self.pos = pos

    def read(self, n):
        out = bytes(self.mv[self.pos:self.pos + n])
        self.pos += len(out)
        return out

    def copy_into(self, offset, buf, nbytes):
        """Copy `nbytes` from `offset` into `buf` (an array or memoryview slice of that many bytes)."""
        import uctypes

        uctypes.bytearray_at(uctypes.addressof(buf), nbytes)[:] = self.mv[offset:offset + nbytes]

    def close(self):
        pass


def open_region(spec):
    """An XipFile over the raw region config.json's runtime["xip"] describes ({"bytes", "crc32"}), after checking
    that it holds that model.bin: its magic, and the CRC-32 stored in its last 4 bytes."""
    import struct

    from .modelfile import MAGIC, FormatError

    size = spec["bytes"]
    if not 0 < size <= RAW_BYTES:
        raise FormatError("config.json gives %d bytes of raw flash; the region has %d" % (size, RAW_BYTES))
    f = XipFile(XIP_BASE + RAW_OFFSET, size)
    if bytes(f.mv[:4]) != MAGIC:
        raise FormatError("the raw flash region holds no model: " + AGAIN)
    stored = struct.unpack("<I", bytes(f.mv[size - 4:size]))[0]
    if stored != spec["crc32"]:
        raise FormatError("the raw flash region holds another model's weights (CRC-32 %08x, this model's %08x): %s"
                          % (stored, spec["crc32"], AGAIN))
    return f
