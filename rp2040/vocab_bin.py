"""tokenizer.json as the bytes of vocab.bin (rp2040/FORMAT.md): raw bytes per id, specials, merges and the
pre-tokenizer flags the device's tokenizer needs; anything it cannot run is one line."""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rp2040.runtime import tokenizer as vf
from utils.errors import PiconeoxError
from utils.textfile import read_json


def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


@dataclass
class Vocab:
    """What the device needs from tokenizer.json: raw bytes per id, specials, merges, pre-tokenizer flags."""

    kind: str  # "byte", "char" or "bpe"
    tokens: list[bytes]
    special: list[bool]
    merges: list[tuple[int, int, int]]  # (left, right, merged) in rank order
    eos: int
    unk: int
    prefix_space: bool
    split: bool

    @classmethod
    def from_tokenizer_json(cls, path: Path, model_vocab: int) -> "Vocab":
        tj = read_json(path, "the tokenizer")
        model = tj.get("model") or {}
        if model.get("type") not in ("BPE", "WordLevel"):
            raise PiconeoxError(f"{path}: tokenizer model {model.get('type')!r} is not supported; allowed: BPE, "
                                "WordLevel")
        pre = tj.get("pre_tokenizer")
        if pre is not None and pre.get("type") != "ByteLevel":
            raise PiconeoxError(f"{path}: pre_tokenizer {pre.get('type')!r} is not supported; allowed: ByteLevel "
                                "or none")
        if tj.get("normalizer") is not None:
            raise PiconeoxError(f"{path}: a normalizer ({tj['normalizer'].get('type')}) is not supported on the device")
        byte_level = pre is not None
        vocab: dict[str, int] = dict(model["vocab"])
        special = {t["id"]: t["content"] for t in tj.get("added_tokens", []) if t.get("special")}
        for t in tj.get("added_tokens", []):
            vocab[t["content"]] = t["id"]
        size = max(vocab.values()) + 1
        if size > model_vocab:
            raise PiconeoxError(f"{path} has {size} tokens but the model's vocab is {model_vocab}")
        tokens, is_special = [b""] * model_vocab, [True] * model_vocab  # ids the tokenizer never makes: empty
        u2b = _unicode_to_byte()
        for text, i in vocab.items():
            if i in special:
                tokens[i] = text.encode("utf-8")
                continue
            tokens[i] = bytes(u2b[c] for c in text) if byte_level else text.encode("utf-8")
            is_special[i] = False
        merges = []
        for m in model.get("merges") or []:
            a, b = m.split(" ") if isinstance(m, str) else m
            merges.append((vocab[a], vocab[b], vocab[a + b]))
        kind = "bpe" if merges else "byte" if byte_level else "char"
        eos = next((i for i, c in special.items() if c == "<|endoftext|>"), -1)
        unk_token = model.get("unk_token")
        return cls(kind, tokens, is_special, merges, eos, vocab.get(unk_token, -1) if unk_token else -1,
                   bool(pre and pre.get("add_prefix_space")), bool(pre and pre.get("use_regex", True)))

    def encode(self) -> bytes:
        """The bytes of vocab.bin (FORMAT.md)."""
        n = len(self.tokens)
        blob = b"".join(self.tokens)
        offsets = np.cumsum([0] + [len(t) for t in self.tokens]).astype("<u4")
        flags = (vf.FLAG_PREFIX_SPACE if self.prefix_space else 0) | (vf.FLAG_SPLIT if self.split else 0)
        out = struct.pack("<4sHBBIIiiI", vf.MAGIC, vf.VERSION, vf.KINDS.index(self.kind), flags, n,
                          len(self.merges), self.eos, self.unk, len(blob)).ljust(vf.HEADER_SIZE, b"\0")
        out += offsets.tobytes() + blob + bytes(self.special)
        out += b"\0" * (-len(out) % 4)
        out += np.asarray(self.merges, "<u2").reshape(-1).tobytes()
        out += b"\0" * (-len(out) % 4)
        return out + struct.pack("<I", zlib.crc32(out))
