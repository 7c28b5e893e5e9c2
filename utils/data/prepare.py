"""Prepare a dataset: text -> tokenizer -> token shards + manifest in data/<name>/ (the CLI: prepare_data.py).

Everything is built in data/<name>/.staging/ first; only a complete run moves its files into place and
writes manifest.json last, so a failed run leaves the previous dataset as it was.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from tokenizers import Tokenizer
from tqdm import tqdm

from utils.atomic import check_writable_dir
from utils.crc import INDEX_NAME, CrcIndex
from utils.data.documents import Source, TextFile, resolve_inputs
from utils.errors import PiconeoxError
from utils.data.shards import MANIFEST_FILE, SPLITS, Manifest, ShardWriter, token_dtype, write_manifest
from utils.data.encode import encode_batches, pieces
from utils.data.tokenizers import (TOKENIZER_FILE, build_tokenizer, check_vocab_size, checkpoint_tokenizer,
                                   file_sha256, missing_chars, read_tokenizer, save_tokenizer, tokenizer_kind)

DEFAULT_SHARD_TOKENS = 50_000_000  # 100 MB per uint16 shard
BATCH_CHARS = 1 << 18  # text per encode task: big enough to amortise the hop to a worker, small enough to balance
STAGING = ".staging"
DOCUMENT_RULE = ("Documents: a file containing <|endoftext|> is split on it, any other file at blank "
                 "lines (one paragraph = one document); an hf row is one document. Documents are "
                 "stripped and each is followed by <|endoftext|> in the token stream. With --val-split "
                 "tail each file is one document, kept as it is.")
VAL_SPLITS = ("documents", "tail")
DEFAULT_VAL_FRACTION = 0.1
Document = tuple[Optional[str], str, int]  # (split, or None when not kept; text; input bytes consumed)


@dataclass(frozen=True)
class Selection:
    """Which documents are kept and which of them go to val: fixed by the seed and document index."""

    dataset_percent: float
    val_fraction: float
    seed: int

    def _uniform(self, index: int, purpose: str) -> float:
        digest = hashlib.blake2b(f"{self.seed}:{purpose}:{index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def split_of(self, index: int) -> str | None:
        """'train', 'val', or None when document `index` is not kept."""
        if self._uniform(index, "keep") * 100 >= self.dataset_percent:
            return None
        return "val" if self._uniform(index, "val") < self.val_fraction else "train"


def _documents(sources: list[Source], val_sources: list[Source], selection: Selection,
               val_split: str) -> Iterator[Document]:
    """Every document of the inputs with the split it goes to, in input order (then the --val inputs)."""
    if val_split == "tail":
        yield from _tail(sources, selection.val_fraction)
        return
    index = 0
    for source in sources:
        for doc, nbytes in source.documents():
            yield selection.split_of(index), doc, nbytes
            index += 1
    for source in val_sources:
        for doc, nbytes in source.documents():
            yield "val", doc, nbytes


def _tail(files: list[TextFile], val_fraction: float) -> Iterator[Document]:
    """nanoGPT's split: the files' text, as it is, cut at character int(n * (1 - val_fraction)).

    Each file is one document (the file straddling the cut becomes two), read whole into memory.
    """
    lengths = [len(f.text()) for f in files]
    cut, start = int(sum(lengths) * (1 - val_fraction)), 0
    for file, n in zip(files, lengths):
        text, k = file.text(), min(max(cut - start, 0), n)
        if k:
            yield "train", text[:k], file.size
        if k < n:
            yield "val", text[k:], 0 if k else file.size
        start += n


@dataclass
class Batch:
    """Consecutive kept documents of one split, plus the input bytes read to reach them."""

    split: str
    docs: list[str]
    input_bytes: int


def _batches(documents: Iterable[Document]) -> Iterator[Batch]:
    """Kept documents grouped per split into ~BATCH_CHARS batches, in input order within each split."""
    pending = {split: Batch(split, [], 0) for split in SPLITS}
    sizes = dict.fromkeys(SPLITS, 0)
    unreported_bytes = 0
    for split, doc, nbytes in documents:
        unreported_bytes += nbytes
        if split is None:
            continue
        batch = pending[split]
        batch.docs.append(doc)
        sizes[split] += len(doc)
        if sizes[split] >= BATCH_CHARS:
            batch.input_bytes, unreported_bytes = unreported_bytes, 0
            yield batch
            pending[split], sizes[split] = Batch(split, [], 0), 0
    for split in SPLITS:
        if pending[split].docs:
            pending[split].input_bytes, unreported_bytes = unreported_bytes, 0
            yield pending[split]


def _progress(sources: list[Source], desc: str) -> tqdm:
    sizes = [s.size for s in sources]
    total = None if None in sizes else sum(sizes)
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, dynamic_ncols=True)


def _texts(sources: list[Source], documents: Iterable[Document], desc: str, splits: tuple[str, ...]) -> Iterator[str]:
    """The kept documents of `splits`, for building or checking a tokenizer, with a progress bar."""
    with _progress(sources, desc) as bar:
        for batch in _batches(documents):
            if batch.split in splits:  # in bounded pieces: BPE training holds a word's pairs at once
                yield from (piece for doc in batch.docs for piece in pieces(doc))
            bar.update(batch.input_bytes)


def _tokenizer(data_dir: Path, staging: Path, kind: str, vocab_size: int | None, retrain: bool,
               texts: Iterable[str]) -> tuple[Tokenizer, str]:
    """Reuse data_dir's tokenizer.json when it is the one asked for, else build one into staging.

    Returns the tokenizer and the sha256 of its tokenizer.json.
    """
    existing = data_dir / TOKENIZER_FILE
    if existing.is_file() and not retrain:
        try:
            tok = read_tokenizer(existing)
        except PiconeoxError as e:
            raise PiconeoxError(f"{e}; pass --retrain-tokenizer") from None
        have, size = tokenizer_kind(tok), tok.get_vocab_size()
        if have != kind or (vocab_size is not None and vocab_size != size):
            asked = kind + (f" with {vocab_size} ids" if vocab_size is not None else "")
            raise PiconeoxError(f"{data_dir} holds a {have} tokenizer with {size} ids, not the {asked} "
                                "asked for: pass --retrain-tokenizer to replace it, or choose another --name")
        if kind == "char" and (missing := missing_chars(tok, texts)):
            shown = ", ".join(repr(c) for c in sorted(missing)[:5])
            raise PiconeoxError(f"{existing} has no id for {len(missing)} characters of this input "
                                f"({shown}): pass --retrain-tokenizer")
        return tok, file_sha256(existing)
    tok = build_tokenizer(kind, texts, vocab_size)
    return tok, save_tokenizer(tok, staging / TOKENIZER_FILE)


def _tokenizer_from(data_dir: Path, staging: Path, source: str, retrain: bool) -> tuple[Tokenizer, str]:
    """A byte-for-byte copy of a checkpoint's tokenizer.json, so the manifest records the checkpoint's sha256."""
    tok, path = checkpoint_tokenizer(source)
    sha = file_sha256(path)
    existing = data_dir / TOKENIZER_FILE
    if existing.is_file() and not retrain and file_sha256(existing) != sha:
        raise PiconeoxError(f"{data_dir} holds another tokenizer than {path}: pass --retrain-tokenizer to replace "
                            "it, or choose another --name")
    shutil.copyfile(path, staging / TOKENIZER_FILE)
    return tok, sha


def _commit(staging: Path, data_dir: Path, manifest: Manifest) -> None:
    """Move the staged files into data_dir, drop shards of an older run, and write the manifest last."""
    (data_dir / MANIFEST_FILE).unlink(missing_ok=True)  # the folder stops counting as a dataset meanwhile
    for path in staging.iterdir():
        os.replace(path, data_dir / path.name)
    keep = {s.name for s in manifest.shards}
    for split in SPLITS:
        for stale in data_dir.glob(f"{split}_*.npy"):
            if stale.name not in keep:
                stale.unlink()
    index = CrcIndex(data_dir / INDEX_NAME)  # every shard was hashed as it was written: its first use hashes nothing
    for shard in manifest.shards:
        index.record(shard.name, (data_dir / shard.name).stat(), shard.crc32c)
    index.save()
    write_manifest(data_dir, manifest)
    staging.rmdir()


def _check_options(name: str, tokenizer: str, vocab_size: int | None, shard_tokens: int,
                   dataset_percent: float, val_fraction: float | None, workers: int, val: list[str],
                   val_split: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise PiconeoxError(f"--name {name!r} is not allowed: use letters, digits, '.', '_' and '-'")
    check_vocab_size(tokenizer, vocab_size)
    if not 1 <= dataset_percent <= 100:
        raise PiconeoxError(f"--dataset-percent {dataset_percent} is out of range: give 1..100")
    if val_fraction is not None and not 0 <= val_fraction < 1:
        raise PiconeoxError(f"--val-fraction {val_fraction} is out of range: give 0 <= F < 1")
    if val_split not in VAL_SPLITS:
        raise PiconeoxError(f"--val-split {val_split!r} is not one of {', '.join(VAL_SPLITS)}")
    if val and (val_split == "tail" or val_fraction):
        other = "--val-split tail" if val_split == "tail" else f"--val-fraction {val_fraction}"
        raise PiconeoxError(f"--val and {other} both choose the val text: give one of them")
    if val_split == "tail" and (val_fraction == 0 or dataset_percent != 100):
        raise PiconeoxError("--val-split tail cuts the whole text: it needs --val-fraction > 0 and no "
                            "--dataset-percent")
    if shard_tokens < 1:
        raise PiconeoxError(f"--shard-tokens {shard_tokens} is out of range: give a positive count")
    if workers < 1:
        raise PiconeoxError(f"--workers {workers} is out of range: give 1 or more")


def prepare(inputs: list[str], name: str, out_dir: str | os.PathLike = "data", tokenizer: str = "byte",
            vocab_size: int | None = None, shard_tokens: int = DEFAULT_SHARD_TOKENS,
            dataset_percent: float = 100.0, val_fraction: float | None = None, seed: int = 0,
            retrain_tokenizer: bool = False, workers: int | None = None, errors: str = "strict",
            val: list[str] = (), val_split: str = "documents", tokenizer_from: str | None = None) -> Path:
    """Build data/<name>/ from `inputs`; returns its path. Raises PiconeoxError on bad input.

    Val text: the documents of `val` (all of them, and all of `inputs` go to train), else the last
    `val_fraction` of the characters (`val_split="tail"`), else that fraction of the documents by seed.
    `val_fraction` None means 0.1, or 0 when `val` is given.
    `tokenizer_from` (a checkpoint folder) replaces `tokenizer`/`vocab_size` with that checkpoint's tokenizer.
    """
    if workers is None:
        workers = os.cpu_count() or 1
    val = list(val)
    _check_options(name, tokenizer, vocab_size, shard_tokens, dataset_percent, val_fraction, workers, val, val_split)
    if val_fraction is None:
        val_fraction = 0.0 if val else DEFAULT_VAL_FRACTION
    sources = resolve_inputs(inputs, errors)
    val_sources = resolve_inputs(val, errors) if val else []
    if other := next((s for s in val_sources if not isinstance(s, TextFile)), None):
        raise PiconeoxError(f"--val takes text files and globs; {other.label} is not one")
    files = {s.path.resolve() for s in sources if isinstance(s, TextFile)}
    if both := [s.label for s in val_sources if isinstance(s, TextFile) and s.path.resolve() in files]:
        raise PiconeoxError(f"--val file(s) are also inputs: {' '.join(both)}")
    if val_split == "tail" and (other := next((s for s in sources if not isinstance(s, TextFile)), None)):
        raise PiconeoxError(f"--val-split tail cuts text files; input {other.label} is not one")
    selection = Selection(dataset_percent, val_fraction, seed)

    def all_documents() -> Iterator[Document]:
        return _documents(sources, val_sources, selection, val_split)

    data_dir = Path(out_dir) / name
    check_writable_dir(data_dir, "--out-dir")
    staging = data_dir / STAGING
    shutil.rmtree(staging, ignore_errors=True)  # left over from a killed run
    staging.mkdir(parents=True)
    try:
        if tokenizer_from:
            tok, tok_sha256 = _tokenizer_from(data_dir, staging, tokenizer_from, retrain_tokenizer)
        else:
            # BPE learns its merges from the train split's text only, so val loss is measured on text the tokenizer
            # never saw; char needs every character of both splits (nanoGPT's vocab), byte reads nothing.
            fit = ("train",) if tokenizer == "bpe" else SPLITS
            texts = [] if tokenizer == "byte" else _texts(sources + val_sources, all_documents(), "read for tokenizer",
                                                          fit)
            tok, tok_sha256 = _tokenizer(data_dir, staging, tokenizer, vocab_size, retrain_tokenizer, texts)
        dtype = token_dtype(tok.get_vocab_size())
        writers = {split: ShardWriter(staging, split, dtype, shard_tokens) for split in SPLITS}
        documents = dict.fromkeys(SPLITS, 0)
        with _progress(sources + val_sources, f"tokenize {name}") as bar:
            for batch, ids in encode_batches(tok, ((b, b.docs) for b in _batches(all_documents())),
                                             dtype, workers):
                writers[batch.split].add(ids)
                documents[batch.split] += len(batch.docs)
                bar.update(batch.input_bytes)
                docs = sum(documents.values())
                bar.set_postfix_str(f"{docs:,} docs, {docs / max(bar.format_dict['elapsed'], 1e-9):,.0f} docs/s, "
                                    f"{sum(w.tokens for w in writers.values()):,} tokens")
        if documents["train"] == 0:
            raise PiconeoxError(f"inputs {' '.join(inputs)} give no training text (empty, or "
                                f"--dataset-percent {dataset_percent} kept nothing)")
        if val and documents["val"] == 0:
            raise PiconeoxError(f"--val {' '.join(val)} gives no documents: give files with text in them")
        if val_fraction > 0 and documents["val"] == 0:
            raise PiconeoxError(f"--val-fraction {val_fraction} put none of the {documents['train']} documents "
                                "in val: give more documents (see the document rule in --help) or --val-fraction 0")
        shards = [shard for split in SPLITS for shard in writers[split].finish()]
        manifest = Manifest(
            vocab_size=tok.get_vocab_size(), dtype=dtype.name, tokenizer_sha256=tok_sha256,
            shards=shards, source=[s.label for s in sources], documents=documents,
            options=dict(tokenizer=tokenizer_kind(tok) if tokenizer_from else tokenizer, vocab_size=vocab_size,
                         shard_tokens=shard_tokens, dataset_percent=dataset_percent, val_fraction=val_fraction,
                         seed=seed, errors=errors, val=[s.label for s in val_sources], val_split=val_split,
                         **({"tokenizer_from": tokenizer_from} if tokenizer_from else {})))
        _commit(staging, data_dir, manifest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if not any(data_dir.iterdir()):
            data_dir.rmdir()  # a first run that failed leaves no empty folder behind
        raise
    return data_dir
