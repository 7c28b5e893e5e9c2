"""Token ids of documents: each document followed by EOT, encoded a bounded piece at a time, on one process or a
pool of forked workers (`prepare_data.py --workers`). The tokenizers themselves are utils/data/tokenizers.py's."""
from __future__ import annotations

import multiprocessing
import os
import re
import signal
from collections import deque
from typing import Iterable, Iterator, TypeVar

import numpy as np
from tokenizers import Tokenizer

from utils.data.tokenizers import EOT


CUT = re.compile(r"(?<=\S) (?=\S)")
PIECE_CHARS = 1 << 16  # text encoded at once: an Encoding costs ~200 bytes a token (a 17 MB line took 3.7 GB whole)


def pieces(text: str) -> Iterator[str]:
    """`text` in pieces of at most PIECE_CHARS characters, each cut before a space where there is one in the piece's
    second half with no other whitespace beside it: ByteLevel pre-tokenizes " word" as one word, so a cut there
    changes no token (a char tokenizer's ids never change); text without such a space is cut where the bound falls."""
    start = 0
    while len(text) - start > PIECE_CHARS:
        end = start + PIECE_CHARS
        for cut in CUT.finditer(text, start + PIECE_CHARS // 2, end):
            end = cut.start()
        yield text[start:end]
        start = end
    yield text[start:]


def encode_documents(tok: Tokenizer, docs: list[str], dtype: np.dtype) -> np.ndarray:
    """Token ids of `docs`, each followed by EOT, as one flat array of `dtype`; encoded a few pieces at a time, so
    memory stays bounded however long one document (one line) is."""
    eot, out = tok.token_to_id(EOT), []
    group: list[tuple[str, bool]] = []  # (piece, whether a document ends with it)

    def flush() -> None:
        ids: list[int] = []
        encodings = tok.encode_batch_fast([p for p, _ in group], add_special_tokens=False)  # no offsets: faster
        for enc, (_, last) in zip(encodings, group):
            ids.extend(enc.ids)
            if last:
                ids.append(eot)
        out.append(np.asarray(ids, dtype=dtype))
        group.clear()

    size = 0
    for doc in docs:
        for piece in pieces(doc):
            if size + len(piece) > 4 * PIECE_CHARS:
                flush()
                size = 0
            group.append((piece, False))
            size += len(piece)
        group[-1] = (group[-1][0], True)
    if group:
        flush()
    return np.concatenate(out) if out else np.zeros(0, dtype)


_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer_json: str) -> None:
    global _worker_tokenizer
    # Ctrl-C reaches the whole process group: only the parent stops (and terminates the pool); a worker
    # interrupted mid-task would leave the pool waiting for a result that never comes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The pool ends its workers with SIGTERM: a handler the parent had (a training process's stop handlers) would
    # run in the worker instead and print a traceback or speak for the run; the default just ends it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the pool already uses the cores
    _worker_tokenizer = Tokenizer.from_str(tokenizer_json)


def _encode_in_worker(docs: list[str], dtype: np.dtype) -> np.ndarray:
    return encode_documents(_worker_tokenizer, docs, dtype)


Tag = TypeVar("Tag")


def encode_batches(tok: Tokenizer, batches: Iterable[tuple[Tag, list[str]]], dtype: np.dtype,
                   workers: int = 1) -> Iterator[tuple[Tag, np.ndarray]]:
    """Encode (tag, docs) batches in order on `workers` processes, yielding (tag, ids).

    At most 2 batches per worker are in flight, so memory stays bounded however large the input is.
    Workers are forked: spawn would re-import the caller's main module (train.py imports torch) in each.
    """
    if workers <= 1:
        for tag, docs in batches:
            yield tag, encode_documents(tok, docs, dtype)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(tok.to_str(),)) as pool:
        pending: deque = deque()
        for tag, docs in batches:
            pending.append((tag, pool.apply_async(_encode_in_worker, (docs, dtype))))
            if len(pending) >= 2 * workers:
                tag_done, result = pending.popleft()
                yield tag_done, result.get()
        while pending:
            tag_done, result = pending.popleft()
            yield tag_done, result.get()
