"""Reader of vocab.bin and the on-device tokenizer (spec: rp2040/FORMAT.md, writer: rp2040/export.py).

All three kinds share one scheme: each token id has its raw bytes; a prompt is split into pieces,
each piece becomes base tokens (one per byte for byte/bpe, one per character for char), and BPE
merges are applied in rank order. Token bytes stay in one bytearray (no per-token objects).
"""
import struct
from array import array

from .modelfile import FormatError

try:
    from binascii import crc32
except ImportError:
    crc32 = None

MAGIC = b"PNXV"
VERSION = 1
HEADER_SIZE = 32
HEADER_FORMAT = "<4sHBBIIiiI"  # magic, version, kind, flags, vocab, merges, eos, unk, token bytes
KINDS = ("byte", "char", "bpe")
FLAG_PREFIX_SPACE = 1
FLAG_SPLIT = 2  # GPT-2 pre-tokenizer split (ByteLevel use_regex)


class Tokenizer:
    """Encode a prompt to ids and decode ids to bytes, from vocab.bin."""

    def __init__(self, path):
        with open(path, "rb") as f:
            data = f.read()
        if data[:4] != MAGIC:
            raise FormatError("not a piconeox vocab.bin (bad magic)")
        (_, version, kind, flags, self.vocab, n_merges, self.eos, self.unk,
         n_bytes) = struct.unpack_from(HEADER_FORMAT, data, 0)
        if version != VERSION:
            raise FormatError("vocab.bin is version %d; this runtime reads version %d" % (version, VERSION))
        if crc32 is not None and crc32(memoryview(data)[:-4]) & 0xFFFFFFFF != struct.unpack_from("<I", data, len(data) - 4)[0]:
            raise FormatError("vocab.bin checksum mismatch (file corrupt or partly copied)")
        self.kind = KINDS[kind]
        self.prefix_space = bool(flags & FLAG_PREFIX_SPACE)
        self.split = bool(flags & FLAG_SPLIT)
        v = self.vocab
        pos = HEADER_SIZE
        self.offsets = array("I", data[pos:pos + 4 * (v + 1)])
        pos += 4 * (v + 1)
        self.token_bytes = data[pos:pos + n_bytes]
        pos += n_bytes
        self.special = data[pos:pos + v]
        pos = (pos + v + 3) & ~3
        self.merges = array("H", data[pos:pos + 6 * n_merges])  # (left, right, merged) in rank order
        self.byte_ids = array("h", [-1] * 256)  # base token of each byte (byte and bpe kinds)
        for t in range(v):
            if not self.special[t] and self.offsets[t + 1] - self.offsets[t] == 1:
                self.byte_ids[self.token_bytes[self.offsets[t]]] = t

    def token(self, t):
        """The raw bytes of token `t` (b"" for special tokens such as end-of-text)."""
        if self.special[t]:
            return b""
        return self.token_bytes[self.offsets[t]:self.offsets[t + 1]]

    def decode(self, ids):
        return b"".join(self.token(t) for t in ids).decode("utf-8")

    def encode(self, text):
        """Token ids of `text`, as the training tokenizer would produce them (exact for ASCII)."""
        if self.prefix_space and text and text[0] != " ":
            text = " " + text
        out = []
        for piece in (pretokenize(text) if self.split else (text,)):
            ids = self._base_ids(piece)
            self._merge(ids)
            out.extend(ids)
        return out

    def _base_ids(self, piece):
        if self.kind != "char":
            ids = []
            for b in piece.encode("utf-8"):
                t = self.byte_ids[b]
                if t >= 0:
                    ids.append(t)
                elif self.unk >= 0:
                    ids.append(self.unk)
            return ids
        ids = []
        for ch in piece:
            t = self._find(ch.encode("utf-8"))
            if t >= 0:
                ids.append(t)
            elif self.unk >= 0:
                ids.append(self.unk)
            # else: dropped, as the tokenizers library drops characters it has no id for
        return ids

    def _find(self, raw):
        off, tb = self.offsets, self.token_bytes
        n = len(raw)
        for t in range(self.vocab):
            if off[t + 1] - off[t] == n and not self.special[t] and tb[off[t]:off[t + 1]] == raw:
                return t
        return -1

    def _merge(self, ids):
        m = self.merges
        for r in range(0, len(m), 3):
            if len(ids) < 2:
                return
            a, b = m[r], m[r + 1]
            i = 0
            while i < len(ids) - 1:
                if ids[i] == a and ids[i + 1] == b:
                    ids[i] = m[r + 2]
                    del ids[i + 1]
                i += 1


def _char_class(c):
    # 0 space, 1 letter, 2 digit, 3 other. MicroPython's str methods are ASCII-only, so beyond ASCII
    # this approximates Unicode classes: no-break space is a space, general punctuation (dashes,
    # curly quotes, ellipsis) is "other", everything else a letter. Exact for ASCII text.
    o = ord(c)
    if c in " \t\n\r\v\f" or o == 0xA0:
        return 0
    if o > 127:
        return 3 if 0x2010 <= o <= 0x205E else 1
    if c.isalpha():
        return 1
    if c.isdigit():
        return 2
    return 3


def pretokenize(text):
    """Split like GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?L+| ?N+| ?[^\\sLN]+|\\s+(?!\\S)|\\s+"""
    pieces = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "'":
            for suffix in ("s", "t", "re", "ve", "m", "ll", "d"):
                if text[i + 1:i + 1 + len(suffix)] == suffix:
                    break
            else:
                suffix = None
            if suffix is not None:
                pieces.append(text[i:i + 1 + len(suffix)])
                i += 1 + len(suffix)
                continue
        cls = _char_class(c)
        j = i
        if c == " " and i + 1 < n and _char_class(text[i + 1]) != 0:
            j = i + 1  # ' ?' joins one space to the run that follows
            cls = _char_class(text[j])
        if cls != 0:
            while j < n and _char_class(text[j]) == cls:
                j += 1
        else:
            while j < n and _char_class(text[j]) == 0:
                j += 1
            if j < n and j - i > 1:
                j -= 1  # \s+(?!\S): leave the last space to the word after it
        pieces.append(text[i:j])
        i = j
    return pieces


class StreamDecoder:
    """Turns a stream of token ids into text, holding back bytes of an unfinished UTF-8 character."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.pending = b""

    def feed(self, t):
        data = self.pending + self.tok.token(t)
        cut = _complete_prefix(data)
        self.pending = data[cut:]
        try:
            return data[:cut].decode("utf-8")
        except UnicodeError:  # a model can emit invalid byte sequences
            return "?" * cut


def _complete_prefix(data):
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII): does its character fit?
            need = 1 if b < 0x80 else 2 if b >> 5 == 6 else 3 if b >> 4 == 14 else 4 if b >> 3 == 30 else 1
            return n if back >= need else n - back
    return n
