"""Encoding on worker processes gives what one process gives."""
import numpy as np

from utils.data.encode import encode_batches, encode_documents
from utils.data.tokenizers import build_tokenizer


def test_encode_documents_appends_eot_and_two_workers_match_one(shakespeare):
    tok = build_tokenizer("byte", [], None)
    docs = [d for d in shakespeare[:200_000].split("\n\n") if d]
    ids = encode_documents(tok, docs[:2], np.uint16)
    assert ids.tolist() == [*docs[0].encode(), 255, *docs[1].encode(), 255]
    batches = [(i, docs[i:i + 50]) for i in range(0, len(docs), 50)]
    one = list(encode_batches(tok, batches, np.uint16, workers=1))
    two = list(encode_batches(tok, batches, np.uint16, workers=2))
    assert [t for t, _ in two] == [t for t, _ in one]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(one, two))
