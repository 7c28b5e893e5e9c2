"""Prepare a dataset: text -> tokenizer -> token shards + manifest in data/<name>/.

    python prepare_data.py demo --name demo --tokenizer byte
    python prepare_data.py ../shared/data/tinyshakespeare/input.txt --name shakespeare --tokenizer char
    python prepare_data.py 'stories/*.txt' --name stories --tokenizer bpe --vocab-size 4096
    python prepare_data.py train.txt --val valid.txt --name wiki --tokenizer bpe --vocab-size 4096
    python prepare_data.py input.txt --val-split tail --name shakespeare-char --tokenizer char

Everything is built in data/<name>/.staging/ first; only a complete run moves its files into place and
writes manifest.json last, so a failed run leaves the previous dataset as it was.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from utils.data.documents import DECODE_ERRORS, INPUT_HELP
from utils.data.prepare import DEFAULT_SHARD_TOKENS, DOCUMENT_RULE, VAL_SPLITS, prepare
from utils.data.shards import SPLITS, read_manifest
from utils.data.tokenizers import KINDS
from utils.diskfull import DiskFull, raise_if_full
from utils.errors import CliParser, Interrupted, PiconeoxError, cli, exit_process


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = CliParser(description=__doc__.split("\n")[0], epilog=DOCUMENT_RULE)
    p.add_argument("inputs", nargs="*", default=["demo"], metavar="INPUT",
                   help=f"{INPUT_HELP} (default: demo, the built-in stories)")
    p.add_argument("--name", help="dataset name: output goes to OUT_DIR/NAME (default: demo for the demo input)")
    p.add_argument("--out-dir", default="data", help="parent folder of the dataset (default: data)")
    p.add_argument("--tokenizer", choices=KINDS, default="byte",
                   help="char: one id per distinct character, plus <|endoftext|>; byte (default): 256 ids, "
                        "id = byte value, 255 = <|endoftext|>; bpe: byte-level BPE with --vocab-size ids")
    p.add_argument("--vocab-size", type=int, help="bpe only: 257..65535")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS,
                   help=f"tokens per shard file (default: {DEFAULT_SHARD_TOKENS:,})")
    p.add_argument("--dataset-percent", type=float, default=100.0, help="keep this %% of documents (1..100)")
    p.add_argument("--val", nargs="+", action="extend", default=[], metavar="FILE|GLOB",
                   help="validation text: every document of these goes to val and every document of the "
                        "INPUTs to train (e.g. a corpus's published validation file)")
    p.add_argument("--val-split", choices=VAL_SPLITS, default="documents",
                   help="documents (default): --val-fraction of the documents, picked by --seed; tail: the "
                        "last --val-fraction of the characters, each file kept whole and as it is "
                        "(nanoGPT's split)")
    p.add_argument("--val-fraction", type=float,
                   help="fraction for val (0 <= F < 1, default: 0.1, or 0 with --val)")
    p.add_argument("--seed", type=int, default=0, help="fixes which documents are kept and which go to val")
    p.add_argument("--tokenizer-from", metavar="PATH", help="tokenize with this checkpoint's tokenizer.json "
                   "(a Pythia folder, or checkpoints/<run>/final) instead of --tokenizer, for train.py "
                   "--init-from PATH")
    p.add_argument("--retrain-tokenizer", action="store_true", help="replace an existing tokenizer.json")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizer processes (default: all cores)")
    p.add_argument("--errors", choices=DECODE_ERRORS, default="strict",
                   help="undecodable (non UTF-8) bytes: strict stops with file and byte offset, "
                        "replace turns them into U+FFFD")
    args = p.parse_args(argv)
    if args.tokenizer_from and (args.tokenizer != "byte" or args.vocab_size is not None):
        p.error("--tokenizer-from replaces --tokenizer and --vocab-size: give one or the other")
    if args.name is None:
        if args.inputs != ["demo"]:
            p.error("--name is required unless the input is demo")
        args.name = "demo"
    return args


@cli
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    kept = f"{Path(args.out_dir) / args.name} is as it was before"
    try:
        data_dir = prepare(args.inputs, args.name, args.out_dir, args.tokenizer, args.vocab_size,
                           args.shard_tokens, args.dataset_percent, args.val_fraction, args.seed,
                           args.retrain_tokenizer, args.workers, args.errors, args.val, args.val_split,
                           args.tokenizer_from)
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {kept}") from None
    except OSError as e:  # e.g. the disk filled up: the previous dataset is still intact
        try:
            raise_if_full(e, args.out_dir, f"dataset {args.name}")
        except DiskFull as full:
            raise PiconeoxError(f"{full}; {kept}") from None
        raise PiconeoxError(f"{e.filename or args.out_dir}: {e.strerror or e}; {kept}") from None
    m = read_manifest(data_dir)
    splits = ", ".join(f"{s} {m.split_tokens(s):,} tokens in {len(m.split_shards(s))} shards "
                       f"({m.documents[s]:,} docs)" for s in SPLITS)
    print(f"{data_dir}: {splits}; vocab {m.vocab_size} ({m.dtype}); {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    exit_process(main())
