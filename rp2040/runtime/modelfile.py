"""Reader of model.bin (spec: rp2040/FORMAT.md; the only writer is rp2040/export.py).

The file is a 64-byte header, then section P (4-byte values: float32 norms and biases for f32 models;
int32 fixed-point norms, biases, row multipliers, shifts and tables for int8 models), then section W
(the matrices, float32 or int8), then a CRC-32 of everything before it.
This module decodes the header, computes where every tensor sits, and reads sections into buffers
the caller allocated (so the caller controls allocation order).
"""
import struct

from .fixed import C_TABLES, GELU_N

try:
    from binascii import crc32
except ImportError:  # a build without binascii.crc32 cannot verify the checksum
    crc32 = None

MAGIC = b"PNXM"
VERSION = 4
VERSIONS = (3, 4)  # 3: every matrix row-major; 4: int8 matrices in 4-row interleaved blocks where they fit
HEADER_SIZE = 64
# magic, version, dtype, flags, vocab, hidden, layers, heads, intermediate, context, rotary dims,
# P values, W bytes, norm eps, rotary base; the rest of the 64 bytes is reserved (zero).
HEADER_FORMAT = "<4sHBB9Iff"
DTYPE_F32 = 0
DTYPE_INT8 = 1
DTYPE_NAMES = ("f32", "int8")
FLAG_TIED = 1
FLAG_PARALLEL_RESIDUAL = 2


class FormatError(ValueError):
    """model.bin is not a valid file of this format version."""


class Header:
    """The fixed 64-byte header of model.bin, decoded and checked."""

    def __init__(self, raw):
        if len(raw) < HEADER_SIZE or bytes(raw[:4]) != MAGIC:
            raise FormatError("not a piconeox model.bin (bad magic)")
        (_, self.version, self.dtype, flags, self.vocab, self.hidden, self.layers, self.heads,
         self.inter, self.context, self.rotary_dims, self.n_params, self.weight_bytes,
         self.norm_eps, self.rotary_base) = struct.unpack_from(HEADER_FORMAT, raw, 0)
        if self.version not in VERSIONS:
            raise FormatError("model.bin is version %d; this runtime reads versions 3 and 4 (export it again)"
                              % self.version)
        if self.dtype not in (DTYPE_F32, DTYPE_INT8):
            raise FormatError("model.bin dtype %d is unknown (0 = f32, 1 = int8)" % self.dtype)
        self.tied = bool(flags & FLAG_TIED)
        self.parallel_residual = bool(flags & FLAG_PARALLEL_RESIDUAL)
        self.int8 = self.dtype == DTYPE_INT8
        self.head_dim = self.hidden // self.heads
        self.typecode = "b" if self.int8 else "f"
        self.itemsize = 1 if self.int8 else 4
        self.p_typecode = "i" if self.int8 else "f"  # section P: int32 fixed point, or float32
        self.blocked = self.int8 and self.version >= 4  # v4 int8: matrices padded to 4 bytes, interleaved

    def interleaved(self, n_out, n_in):
        """Whether the [n_out, n_in] matrix is stored in 4-row interleaved blocks (bytes q + 128; FORMAT.md)."""
        return self.blocked and n_out % 4 == 0 and n_in % 8 == 0


class Layout:
    """Offsets of every tensor, in elements: 4-byte elements of P and weight elements of W.

    P holds one contiguous block per layer (norms, biases and, for int8, that layer's row multipliers
    and shifts), so a runtime short of RAM reads a layer's P block and W block per step and keeps neither.
    """

    def __init__(self, h):
        d, n, v, layers = h.hidden, h.inter, h.vocab, h.layers
        # P block of a layer: ln1.w ln1.b ln2.w ln2.b qkv.b[3d] dense.b[d] fc_in.b[n] fc_out.b[d],
        # then int8 only: row multipliers of qkv[3d] dense[d] fc_in[n] fc_out[d], and 6 shifts
        # (ln1, ln2, qkv, dense, fc_in, fc_out).
        self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b = 0, d, 2 * d, 3 * d
        self.qkv_b, self.dense_b, self.fc_in_b, self.fc_out_b = 4 * d, 7 * d, 8 * d, 8 * d + n
        self.qkv_s, self.dense_s, self.fc_in_s, self.fc_out_s = 9 * d + n, 12 * d + n, 13 * d + n, 13 * d + 2 * n
        self.shifts = 14 * d + 2 * n  # int8: ln1, ln2, qkv, dense, fc_in, fc_out
        self.p_layer = 9 * d + n + (5 * d + n + 6 if h.int8 else 0)
        # After the layers: final norm, then int8 only: embedding row multipliers[v], untied head's[v],
        # then the constants block (fixed.py: shifts, eps, GELU table, rotary cos and sin).
        self.final_ln_w = layers * self.p_layer
        self.final_ln_b = self.final_ln_w + d
        self.s_embed = self.final_ln_b + d
        self.s_head = self.s_embed + (0 if h.tied else v)
        self.consts = self.s_embed + (v if h.tied else 2 * v)
        half = h.rotary_dims // 2
        self.gelu = C_TABLES  # offsets inside the constants block
        self.cos = self.gelu + GELU_N
        self.sin = self.cos + h.context * half
        self.n_consts = self.sin + h.context * half
        self.n_params = self.consts + self.n_consts if h.int8 else self.s_embed
        # W: embedding [v x d]; per layer qkv [3d x d] dense [d x d] fc_in [n x d] fc_out [d x n]; head.
        # v4 int8 pads each matrix to a multiple of 4 bytes, so every matrix starts word aligned.
        def size(n_out, n_in):
            return (n_out * n_in + 3) & ~3 if h.blocked else n_out * n_in

        self.qkv, self.dense = 0, size(3 * d, d)
        self.fc_in = self.dense + size(d, d)
        self.fc_out = self.fc_in + size(n, d)
        self.w_layer = self.fc_out + size(d, n)
        self.w_layers0 = size(v, d)
        self.w_head = 0 if h.tied else self.w_layers0 + layers * self.w_layer
        self.n_weights = self.w_layers0 + layers * self.w_layer + (0 if h.tied else size(v, d))
        if self.n_params != h.n_params or self.n_weights * h.itemsize != h.weight_bytes:
            raise FormatError("model.bin header sizes do not match its shape (corrupt or foreign file)")
        self.p_offset = HEADER_SIZE  # byte offsets in the file
        self.w_offset = HEADER_SIZE + 4 * self.n_params
        self.end = self.w_offset + h.weight_bytes
        self.crc_offset = (self.end + 3) & ~3


def read_header(f):
    """Decode the header of an open model.bin and return (Header, Layout)."""
    f.seek(0)
    h = Header(f.read(HEADER_SIZE))
    return h, Layout(h)


def read_into(f, offset, buf, nbytes):
    """Fill `buf` (an array or memoryview slice holding `nbytes` bytes) from the file at `offset`."""
    if hasattr(f, "copy_into"):  # xip.XipFile: memory-mapped flash
        f.copy_into(offset, buf, nbytes)
        return
    f.seek(offset)
    if f.readinto(buf) != nbytes:
        raise FormatError("model.bin is truncated")


def verify_checksum(f, layout):
    """Check the trailing CRC-32, streaming the file through a small buffer.

    Returns False when this MicroPython build has no binascii.crc32 (nothing was checked).
    """
    if crc32 is None:
        return False
    if hasattr(f, "mv"):  # xip.XipFile: one pass over the mapping, no buffer
        stored = struct.unpack("<I", bytes(f.mv[layout.crc_offset:layout.crc_offset + 4]))[0]
        if (crc32(f.mv[:layout.crc_offset]) & 0xFFFFFFFF) != stored:
            raise FormatError("model.bin checksum mismatch (file corrupt or partly copied)")
        return True
    buf = bytearray(256)
    mv = memoryview(buf)
    f.seek(0)
    crc, left = 0, layout.crc_offset
    while left:
        n = f.readinto(mv[:min(left, 256)])
        if not n:
            raise FormatError("model.bin is truncated")
        crc = crc32(mv[:n], crc)
        left -= n
    tail = f.read(4)
    if len(tail) != 4:
        raise FormatError("model.bin is truncated")
    stored = struct.unpack("<I", tail)[0]
    if (crc & 0xFFFFFFFF) != stored:
        raise FormatError("model.bin checksum mismatch (file corrupt or partly copied)")
    return True
