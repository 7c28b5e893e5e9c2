"""A model.bin too large for the raw gap, read in place from the littlefs blocks of its file (model.blk).

littlefs v2 keeps a file's data in 4 KiB blocks; block n >= 1 of a file begins with ctz(n) + 1 four-byte
skip-list pointers, and the blocks lie wherever the allocator put them. model.blk is model.bin laid out for
that (rp2040/blockfile.py writes it; plan() here says where everything goes): the header and section P
first (read as a file), then from the next block of the file on, each block's data holds a 16-byte tag
(magic, the model's CRC-32, the block's index n in the file, the CRC-32 of the rest of its data) and whole
4-row interleaved groups of one matrix. At load the runtime finds each block's flash address by its tag,
checks its CRC-32, and then multiplies straight from memory-mapped flash: one matvec4 call per block.
A block missing, or holding another model's bytes, is refused in one line.
"""
import struct
from array import array

from . import fixed as fx
from . import intkernels as IK
from .gpt import IntGPT, Zeros
from .modelfile import FormatError, read_header, read_into

try:
    from binascii import crc32
except ImportError:
    crc32 = None

TAG = b"PNXB"
TAG_BYTES = 16  # magic, model CRC-32, block index, CRC-32 of the block's data after the tag
LFS_BLOCK = 4096
LFS_OFFSET = 0xA0000  # RPI_PICO's littlefs: flash offset and block count
LFS_BLOCKS = 352
XIP_BASE = 0x10000000
AGAIN = "flash this model again with python -m rp2040.flash"


def pointers(n):
    """Bytes of skip-list pointers littlefs v2 puts at the start of block n of a file."""
    if n == 0:
        return 0
    c = 0
    while not (n >> c) & 1:
        c += 1
    return 4 * (c + 1)


def matrices(h, lay):
    """(W element offset, rows, columns) of every matrix, in W order."""
    d, n = h.hidden, h.inter
    out = [(0, h.vocab, d)]
    for layer in range(h.layers):
        b = lay.w_layers0 + layer * lay.w_layer
        out += [(b + lay.qkv, 3 * d, d), (b + lay.dense, d, d), (b + lay.fc_in, n, d), (b + lay.fc_out, d, n)]
    if not h.tied:
        out.append((lay.w_head, h.vocab, d))
    return out


def plan(h, lay):
    """(first W block, blocks in the file, [(w_off, rows, columns, [(block n, first row, rows)])]): the header
    and P fill the file's first blocks, then each block holds whole 4-row groups of one matrix."""
    n, end = 0, 0
    while end < lay.w_offset:
        end += LFS_BLOCK - pointers(n)
        n += 1
    first, out = n, []
    for w_off, n_out, n_in in matrices(h, lay):
        chunks, r0 = [], 0
        while r0 < n_out:
            rows = min(4 * ((LFS_BLOCK - pointers(n) - TAG_BYTES) // (4 * n_in)), n_out - r0)
            if rows <= 0:
                raise FormatError("a 4-row block of %d columns does not fit a littlefs block" % n_in)
            chunks.append((n, r0, rows))
            r0 += rows
            n += 1
        out.append((w_off, n_out, n_in, chunks))
    return first, n, out


def locate(model_crc, first, count):
    """Flash addresses of the data after the tag of this model's blocks first..count-1 in littlefs (an array
    indexed by n - first), each checked against its CRC-32; one line when any is missing (another model's, or
    none)."""
    import uctypes

    found = array("i", Zeros(count - first))
    for b in range(LFS_BLOCKS):
        a = XIP_BASE + LFS_OFFSET + b * LFS_BLOCK
        mv = memoryview(uctypes.bytearray_at(a, LFS_BLOCK))
        for k in range(0, 48, 4):
            if mv[k:k + 4] != TAG:
                continue
            m, n, c = struct.unpack("<III", mv[k + 4:k + TAG_BYTES])
            if m == model_crc and first <= n < count and pointers(n) == k and not found[n - first]:
                if crc32 is None or crc32(mv[k + TAG_BYTES:]) & 0xFFFFFFFF == c:
                    found[n - first] = a + k + TAG_BYTES
    have = sum(1 for a in found if a)
    if have != count - first:
        raise FormatError("the flash holds %d of this model's %d weight blocks (another model's, or a copy cut "
                          "short): %s" % (have, count - first, AGAIN))
    return found


class BlockGPT(IntGPT):
    """IntGPT whose matrices are read in place from model.blk's littlefs blocks: one matvec4 call per block,
    given addresses (viper takes an int for a pointer), so no object is made per block or per token."""

    def __init__(self, f, h, lay, spec):
        super().__init__(f, h, lay, False, True, True)  # P into RAM, the weights stay in flash
        f.close()
        import uctypes

        first, count, mats = plan(h, lay)
        if count != spec["blocks"]:
            raise FormatError("config.json and model.blk disagree on the blocks (%d, %d): %s"
                              % (spec["blocks"], count, AGAIN))
        found = locate(spec["crc32"], first, count)
        d = h.hidden
        outs = [self.logits] + [self.qkv, self.out, self.mlp, self.h2] * h.layers
        self.chunks = {}  # W offset -> array of (out address, weights address, first row, rows) per block
        for (w_off, _, _, chunks), out in zip(mats, outs):
            o = uctypes.addressof(out)
            self.chunks[w_off] = array("i", [v for b, r0, rows in chunks
                                             for v in (o + 4 * r0, found[b - first], r0, rows)])
        self.head = self.chunks[0 if h.tied else lay.w_head]
        emb = self.chunks[0]
        self.emb = array("i", Zeros(h.vocab >> 2))  # address of each 4-row group of the embedding
        for j in range(0, len(emb), 4):
            for g in range(emb[j + 3] >> 2):
                self.emb[(emb[j + 2] >> 2) + g] = emb[j + 1] + g * 4 * d

    def _linear(self, out, x, n_out, n_in, limit, w, w_off, p, m_off, shift, b_off):
        s = IK.quantize(self.xq, 0, x, 0, n_in, limit)
        sh, xq, mv4, c = shift - s, self.xq, IK.matvec4, self.chunks[w_off]
        for j in range(0, len(c), 4):
            r0 = c[j + 2]
            mv4(c[j], c[j + 1], 0, xq, c[j + 3], n_in, p, m_off + r0, sh, b_off + r0)

    def _embed(self, token, d):
        mult = self.params[self.lay.s_embed + token]
        s = self.params[self.c_off + fx.C_EMBED_S] - fx.ACT_FRAC
        IK.embed(self.x, self.emb[token >> 2], token & 3, 4, 0, d, mult, s)

    def _head(self, shift):
        prm, xq, d, m0, mv4, c = self.params, self.xq, self.h.hidden, self.lay.s_head, IK.matvec4, self.head
        for j in range(0, len(c), 4):
            mv4(c[j], c[j + 1], 0, xq, c[j + 3], d, prm, m0 + c[j + 2], shift, -1)

    def close(self):
        pass


def prefix_crc(f, nbytes):
    """CRC-32 of the file's first `nbytes`, read through a small buffer."""
    buf = bytearray(512)
    mv = memoryview(buf)
    crc, pos = 0, 0
    while pos < nbytes:
        k = min(512, nbytes - pos)
        read_into(f, pos, mv[:k], k)
        crc = crc32(mv[:k], crc)
        pos += k
    return crc & 0xFFFFFFFF


def open_blocks(path, spec):
    """BlockGPT over model.blk at `path` (config.json's runtime["blocks"]: {"crc32", "prefix_crc32", "blocks"}),
    after checking its header and section P against the CRC-32 config.json names."""
    f = open(path, "rb")
    try:
        h, lay = read_header(f)
        if not h.blocked or not all(h.interleaved(r, c) for _, r, c in matrices(h, lay)):
            raise FormatError("only an int8 v4 model.bin whose matrices are all interleaved is read from blocks")
        if crc32 is not None and prefix_crc(f, lay.w_offset) != spec["prefix_crc32"]:
            raise FormatError("model.blk is not this model's (its header and P differ): " + AGAIN)
    except Exception:
        f.close()
        raise
    return BlockGPT(f, h, lay, spec)
