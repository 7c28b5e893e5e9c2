"""Token shards and their manifest: the one writer and reader of the prepared-dataset format.

A prepared dataset is a folder `data/<name>/` holding
- `tokenizer.json`
- `train_00000.npy`, `train_00001.npy`, ..., `val_00000.npy`, ...: 1-D arrays of token ids, uint16 when
  the vocab fits (<= 65,536 ids), else uint32. Documents are packed back to back, each followed by EOT.
- `manifest.json`, written last: per shard its file name, split, token count, byte size and crc32c, plus
  dtype, vocab size, the sha256 of tokenizer.json, the sources and the options used. The folder counts as
  a dataset only when the manifest exists and matches the files (`verify_dataset`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from utils.atomic import atomic_write, atomic_write_json
from utils.crc import INDEX_NAME, CrcIndex, crc32c_file
from utils.errors import PiconeoxError
from utils.data.tokenizers import TOKENIZER_FILE, file_sha256, read_tokenizer
from utils.storage.base import no_link_below
from utils.textfile import read_json

SPLITS = ("train", "val")
MANIFEST_FILE = "manifest.json"
MAX_SHARDS = 100_000  # 5T tokens of 50M-token shards; a manifest of 1M entries would take minutes to check


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of the vocab."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def shard_name(split: str, index: int) -> str:
    """File name of shard `index` of `split`, e.g. train_00003.npy."""
    return f"{split}_{index:05d}.npy"


@dataclass
class ShardInfo:
    """One shard file as the manifest records it."""

    name: str
    split: str
    tokens: int
    bytes: int
    crc32c: int


@dataclass
class Manifest:
    """Everything a reader needs to trust and use a prepared dataset."""

    vocab_size: int
    dtype: str
    tokenizer_sha256: str
    shards: list[ShardInfo]
    source: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    documents: dict[str, int] = field(default_factory=dict)  # documents per split

    def split_shards(self, split: str) -> list[ShardInfo]:
        """The shards of `split`, in stream order."""
        return [s for s in self.shards if s.split == split]

    def split_tokens(self, split: str) -> int:
        """Total tokens of `split`."""
        return sum(s.tokens for s in self.split_shards(split))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Manifest":
        """Inverse of to_dict; KeyError/TypeError on a malformed dict."""
        return cls(**{**d, "shards": [ShardInfo(**s) for s in d["shards"]]})


class ShardWriter:
    """Cuts one split's token stream into shards of `shard_tokens` tokens (the last may be shorter)."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.directory, self.split, self.dtype, self.shard_tokens = Path(directory), split, dtype, shard_tokens
        self.shards: list[ShardInfo] = []
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0

    @property
    def tokens(self) -> int:
        """Tokens written or buffered so far."""
        return sum(s.tokens for s in self.shards) + self._pending_tokens

    def add(self, ids: np.ndarray) -> None:
        """Append ids to the stream, writing every shard that fills up."""
        self._pending.append(ids.astype(self.dtype, copy=False))
        self._pending_tokens += len(ids)
        while self._pending_tokens >= self.shard_tokens:
            stream = np.concatenate(self._pending)
            self._write(stream[: self.shard_tokens])
            self._pending, self._pending_tokens = [stream[self.shard_tokens:]], len(stream) - self.shard_tokens

    def finish(self) -> list[ShardInfo]:
        """Write the last partial shard; returns every shard written."""
        if self._pending_tokens:
            self._write(np.concatenate(self._pending))
        self._pending, self._pending_tokens = [], 0
        return self.shards

    def _write(self, ids: np.ndarray) -> None:
        path = self.directory / shard_name(self.split, len(self.shards))
        with atomic_write(path) as f:
            np.lib.format.write_array(f, ids, allow_pickle=False)
        self.shards.append(ShardInfo(path.name, self.split, len(ids), path.stat().st_size, crc32c_file(path)))


def write_manifest(data_dir: str | os.PathLike, manifest: Manifest) -> None:
    """Write manifest.json atomically; call it last, it is what makes the folder a dataset."""
    atomic_write_json(Path(data_dir) / MANIFEST_FILE, manifest.to_dict())


def read_manifest(data_dir: str | os.PathLike) -> Manifest:
    """Parse data_dir/manifest.json (no checks against the files: see verify_dataset)."""
    path = no_link_below(data_dir, MANIFEST_FILE)  # a dataset folder holds regular files, never links
    if not path.is_file():
        raise PiconeoxError(f"{path} not found: {data_dir} is not a prepared dataset (run prepare_data.py)")
    try:
        raw = read_json(path)  # bounded in size and depth
    except PiconeoxError as e:
        raise PiconeoxError(f"{e}: {path.name} is not a valid manifest; prepare the data again") from None
    if len(raw.get("shards") or ()) > MAX_SHARDS:
        raise PiconeoxError(f"{path}: {len(raw['shards']):,} shards, more than the {MAX_SHARDS:,} allowed")
    try:
        manifest = Manifest.from_dict(raw)
    except (ValueError, KeyError, TypeError) as e:
        raise PiconeoxError(f"{path} is not a valid manifest ({e}): prepare the data again") from None
    names = [s.name for s in manifest.shards]
    if len(set(map(str, names))) != len(names):  # one file listed twice would be read (and allocated for) twice
        twice = next(n for n in names if names.count(n) > 1)
        raise PiconeoxError(f"{path} lists shard {str(twice)[:100]!r} more than once: each shard is one file, "
                            "listed once; prepare the data again")
    return manifest


def open_shard(data_dir: str | os.PathLike, shard: ShardInfo) -> np.ndarray:
    """Memory-map one shard read-only."""
    return np.load(Path(data_dir) / shard.name, mmap_mode="r", allow_pickle=False)


def verify_dataset(data_dir: str | os.PathLike, check_crc: bool = False, expected_vocab: int | None = None,
                   expected_tokenizer_sha256: str | None = None) -> Manifest:
    """Check the manifest against the files; returns it, or raises PiconeoxError with one line.

    Always: tokenizer.json hash and vocab size, every shard's existence, byte size, dtype and length.
    Also each shard's crc32c, hashed on first use and then cached by size and mtime in the folder's
    .crc32c-index.json (the index the sync and prepare_data.py keep), so later runs hash nothing.
    With check_crc: re-hash every shard regardless of the index, and check that no token id is >= the
    vocab size (reads all data).
    `expected_vocab` / `expected_tokenizer_sha256` refuse a dataset that a model was not built for.
    """
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    if expected_vocab is not None and expected_vocab != manifest.vocab_size:
        raise PiconeoxError(f"{data_dir} has vocab size {manifest.vocab_size}, but the model expects "
                            f"{expected_vocab}: use the dataset the model was trained on")
    tok_path = no_link_below(data_dir, TOKENIZER_FILE)
    if not tok_path.is_file():
        raise PiconeoxError(f"{tok_path} is missing: prepare the data again")
    sha = file_sha256(tok_path)
    if sha != manifest.tokenizer_sha256:
        raise PiconeoxError(f"{tok_path} (sha256 {sha[:12]}) is not the tokenizer the manifest names "
                            f"({manifest.tokenizer_sha256[:12]}): prepare the data again")
    if expected_tokenizer_sha256 is not None and sha != expected_tokenizer_sha256:
        raise PiconeoxError(f"{tok_path} (sha256 {sha[:12]}) is not the tokenizer the model was trained "
                            f"with ({expected_tokenizer_sha256[:12]})")
    tok_vocab = read_tokenizer(tok_path).get_vocab_size()
    if tok_vocab != manifest.vocab_size:
        raise PiconeoxError(f"{tok_path} has {tok_vocab} ids but the manifest says vocab size "
                            f"{manifest.vocab_size}: prepare the data again")
    if manifest.dtype != token_dtype(manifest.vocab_size).name:
        raise PiconeoxError(f"{data_dir}: manifest dtype {manifest.dtype} does not fit vocab size "
                            f"{manifest.vocab_size} (expected {token_dtype(manifest.vocab_size).name})")
    index = CrcIndex(data_dir / INDEX_NAME)
    try:
        for shard in tqdm(manifest.shards, desc=f"verify {data_dir}", unit="shard", leave=False, disable=None):
            _verify_shard(data_dir, manifest, shard, check_crc, index)
    finally:
        with contextlib.suppress(OSError):  # a read-only dataset is hashed again next time
            index.save()
    return manifest


def _verify_shard(data_dir: Path, manifest: Manifest, shard: ShardInfo, check_crc: bool, index: CrcIndex) -> None:
    if shard.split not in SPLITS or not isinstance(shard.name, str) or Path(shard.name).name != shard.name:
        raise PiconeoxError(f"{data_dir}: manifest lists shard {shard.name!r} of split {shard.split!r}; "
                            f"allowed are plain file names in splits {', '.join(SPLITS)}")
    path = no_link_below(data_dir, shard.name)
    if not path.is_file():
        raise PiconeoxError(f"{path} is listed in the manifest but missing: download or prepare the data again")
    st = path.stat()
    size = st.st_size
    itemsize = np.dtype(manifest.dtype).itemsize
    if not (type(shard.tokens) is int and type(shard.bytes) is int and 0 <= shard.tokens * itemsize <= shard.bytes):
        raise PiconeoxError(f"{path}: the manifest says {shard.tokens!r} tokens in {shard.bytes!r} bytes, which "
                            "cannot be: prepare the data again")
    if size != shard.bytes:
        raise PiconeoxError(f"{path} has {size} bytes, the manifest says {shard.bytes}: the file is "
                            "truncated or replaced; download or prepare the data again")
    try:
        ids = open_shard(data_dir, shard)
    except ValueError as e:
        raise PiconeoxError(f"{path} is not a readable .npy shard ({e})") from None
    if ids.dtype != np.dtype(manifest.dtype) or ids.shape != (shard.tokens,):
        raise PiconeoxError(f"{path} holds {ids.dtype}{list(ids.shape)}, the manifest says "
                            f"{manifest.dtype}[{shard.tokens}]")
    crc = crc32c_file(path) if check_crc else index.crc32c(shard.name, path, st)
    if crc != shard.crc32c:
        raise PiconeoxError(f"{path} has crc32c {crc:08x}, the manifest says {shard.crc32c:08x}: "
                            "the file is corrupt; download or prepare the data again")
    if check_crc:
        top = int(ids.max()) if len(ids) else -1
        if top >= manifest.vocab_size:
            raise PiconeoxError(f"{path} holds token id {top}, not below the vocab size "
                                f"{manifest.vocab_size}: the shard was made with another tokenizer")
