"""Encoding on worker processes gives what one process gives."""
import subprocess
import sys
from pathlib import Path

import numpy as np

from utils.data.encode import encode_batches, encode_documents
from utils.data.tokenizers import build_tokenizer
from tests.support.bounds import bound


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


def test_workers_end_quietly_under_a_parent_that_handles_sigterm(tmp_path):
    """The pool ends its workers with SIGTERM; a training process's own SIGTERM handler, inherited by the fork,
    must not run in them (it printed a KeyboardInterrupt traceback into a Slurm job's log)."""
    script = (
        "import signal, sys, numpy as np\n"
        "def stop(*_):\n"
        "    sys.stderr.write('parent handler ran\\n'); raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "from utils.data.encode import encode_batches\n"
        "from utils.data.tokenizers import build_tokenizer\n"
        "tok = build_tokenizer('byte', [], None)\n"
        "batches = [(i, ['some words %d' % i] * 20) for i in range(40)]\n"
        "out = list(encode_batches(tok, batches, np.uint16, workers=2))\n"
        "print(len(out))\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=bound(120))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "40"
    assert "parent handler ran" not in done.stderr and "Traceback" not in done.stderr, done.stderr
