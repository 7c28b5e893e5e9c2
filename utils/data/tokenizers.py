"""Build, save, load and run the three tokenizers: char, byte and byte-level BPE.

All three are `tokenizers.Tokenizer` objects saved as `tokenizer.json`, so
`transformers.PreTrainedTokenizerFast` loads any of them, and all have the special token EOT.
- char: one id per distinct character of the corpus, then EOT (nanoGPT's Shakespeare-char recipe).
- byte: exactly 256 ids, id == byte value. Id 255 is EOT: byte 0xFF never occurs in UTF-8 text, so
  the slot is free, and the vocabulary stays 256 for the RP2040 models.
- bpe: byte-level BPE trained with the `tokenizers` library, 257..65,535 ids, EOT is id 0.
Decoding char and byte ids gives the exact text back.
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, trainers
from tokenizers.pre_tokenizers import ByteLevel

from utils.atomic import atomic_write
from utils.data.tokenizer_check import check_tokenizer_json
from utils.errors import PiconeoxError, leave_running

EOT = "<|endoftext|>"
KINDS = ("char", "byte", "bpe")
BPE_MIN_VOCAB, BPE_MAX_VOCAB = 257, 65_535
TOKENIZER_FILE = "tokenizer.json"


def check_vocab_size(kind: str, vocab_size: int | None) -> None:
    """Refuse a tokenizer kind or vocab size that cannot be built, with one line saying what is allowed."""
    if kind not in KINDS:
        raise PiconeoxError(f"--tokenizer {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "bpe" and vocab_size is None:
        raise PiconeoxError(f"--vocab-size is required for bpe: give {BPE_MIN_VOCAB}..{BPE_MAX_VOCAB}")
    if kind == "bpe" and not BPE_MIN_VOCAB <= vocab_size <= BPE_MAX_VOCAB:
        raise PiconeoxError(f"--vocab-size {vocab_size} is out of range for bpe: "
                            f"give {BPE_MIN_VOCAB}..{BPE_MAX_VOCAB}")
    if kind == "byte" and vocab_size not in (None, 256):
        raise PiconeoxError(f"--vocab-size {vocab_size} is not allowed for byte: it is always 256 (omit it)")
    if kind == "char" and vocab_size is not None:
        raise PiconeoxError(f"--vocab-size {vocab_size} is not allowed for char: the vocab is the "
                            "distinct characters of the text (omit it)")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that the ByteLevel pre-tokenizer uses."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _char_tokenizer(texts: Iterable[str]) -> Tokenizer:
    chars: set[str] = set()
    for text in texts:
        chars.update(text)
    # A BPE model with no merges maps each character to its own id; Fuse joins them back without spaces.
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(chars))}, merges=[]))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([EOT])
    return tok


def _byte_tokenizer() -> Tokenizer:
    table = byte_to_unicode()
    vocab = {table[b]: b for b in range(255)}
    vocab[EOT] = 255
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])
    return tok


def _interruptible(work) -> None:
    """Run `work` on a daemon thread while the main thread waits in short slices.

    BPE training runs in Rust (and pulls the texts from its own thread), so Python's Ctrl-C handler
    would only run once the whole training returned; this way KeyboardInterrupt comes at once.
    """
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as e:  # handed to the main thread
            failed.append(e)

    thread = threading.Thread(target=run, name="bpe-train", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.1)
    except BaseException:
        leave_running(thread)  # Rust cannot be stopped: the CLI must not wait for it, nor unwind it at exit
        raise
    if failed:
        raise failed[0]


def _bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=ByteLevel.alphabet(), show_progress=False)
    _interruptible(lambda: tok.train_from_iterator(texts, trainer=trainer))
    if tok.get_vocab_size() < vocab_size:  # the text ran out of pairs to merge
        raise PiconeoxError(f"--vocab-size {vocab_size} is more than this text supports: BPE found only "
                            f"{tok.get_vocab_size()} tokens; give at most that or more text")
    return tok


def build_tokenizer(kind: str, texts: Iterable[str], vocab_size: int | None) -> Tokenizer:
    """Build a tokenizer of `kind`; char reads `texts` for its characters, bpe trains on them, byte ignores them."""
    check_vocab_size(kind, vocab_size)
    if kind == "char":
        return _char_tokenizer(texts)
    if kind == "byte":
        return _byte_tokenizer()
    return _bpe_tokenizer(texts, vocab_size)


def tokenizer_kind(tok: Tokenizer) -> str:
    """Which of KINDS built `tok` (read from its decoder and vocabulary)."""
    if isinstance(tok.decoder, decoders.Fuse):
        return "char"
    if tok.get_vocab_size() == 256 and tok.token_to_id(EOT) == 255:
        return "byte"
    return "bpe"


def missing_chars(tok: Tokenizer, texts: Iterable[str]) -> set[str]:
    """Characters of `texts` that a char tokenizer has no id for (it would drop them silently)."""
    vocab = tok.get_vocab()
    seen: set[str] = set()
    for text in texts:
        seen.update(text)
    return {c for c in seen if c not in vocab}


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> str:
    """Write `tok` as tokenizer.json atomically; returns the sha256 of the bytes written."""
    data = tok.to_str().encode("utf-8")
    with atomic_write(path) as f:
        f.write(data)
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 hex digest of a file (tokenizer.json is small, so one read)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_tokenizer(path: str | os.PathLike, flag: str = "", max_ids: int | None = None) -> Tokenizer:
    """tokenizer.json as a Tokenizer, once its size, its pipeline (only the pieces piconeox's tokenizers use) and its
    counts of ids and merges are within bounds (utils.data.tokenizer_check), and it has at most `max_ids` ids: all
    read from the JSON before anything is built. Anything else is one PiconeoxError line."""
    from utils.textfile import read_json

    label = f"{flag} {path}".lstrip()
    check_tokenizer_json(read_json(path, flag), label, max_ids)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on a bad file
        raise PiconeoxError(f"{label} is not a readable tokenizer ({str(e).splitlines()[0][:200]})") from None


def checkpoint_tokenizer(source: str | os.PathLike) -> tuple[Tokenizer, Path]:
    """The tokenizer.json of a checkpoint folder (or the file itself) for `prepare_data.py --tokenizer-from`.

    It must have the EOT token `<|endoftext|>`: the token stream separates documents with it (GPT-NeoX's and
    Pythia's tokenizers have it).
    """
    from utils.storage.base import no_link_below

    path = Path(source)
    try:  # inside a folder, never a link (the file named itself may be one)
        path = no_link_below(path, TOKENIZER_FILE) if path.is_dir() else path
    except PiconeoxError as e:
        raise PiconeoxError(f"--tokenizer-from {e}") from None
    if not path.is_file():
        raise PiconeoxError(f"--tokenizer-from {source}: no {TOKENIZER_FILE} there (give a checkpoint folder "
                            f"holding one, or the file)")
    tok = read_tokenizer(path, f"--tokenizer-from {source}:")
    if tok.token_to_id(EOT) is None:
        raise PiconeoxError(f"--tokenizer-from {source}: the tokenizer has no {EOT} token to separate documents with")
    return tok, path


def load_tokenizer(data_dir: str | os.PathLike):
    """The dataset's tokenizer.json as a transformers PreTrainedTokenizerFast with eos and pad = EOT."""
    from transformers import PreTrainedTokenizerFast  # heavy import, only for callers that need it

    path = Path(data_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise PiconeoxError(f"{path} not found: prepare the data first (python prepare_data.py ...)")
    read_tokenizer(path)  # bounded before transformers builds it
    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=EOT, pad_token=EOT,
                                   clean_up_tokenization_spaces=False)
