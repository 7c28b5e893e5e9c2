"""Sample text from a checkpoint, or report its validation loss and perplexity.

    python -m utils.generate checkpoints/<run>/best --prompt "Once upon a time" --max-new-tokens 200
    python -m utils.generate checkpoints/<run>/final --eval-data data/<name> [--eval-batches 50]
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from utils.ckpt.read import open_checkpoint
from utils.data.loader import BlockLoader
from utils.data.tokenizers import TOKENIZER_FILE, tokenizer_kind
from utils.errors import CliParser, PiconeoxError, cli, exit_process
from utils.lm import evaluate, sample_text
from utils.textfile import printable


def evaluate_checkpoint(model, tokenizer, data_dir: str, seq_len: int, batch_size: int, num_batches: int) -> float:
    """Mean validation cross-entropy of `model` on a prepared dataset's val split, refused unless the
    dataset was tokenized with the checkpoint's tokenizer (other ids would give a meaningless number)."""
    from tokenizers import Tokenizer

    loader = BlockLoader(data_dir, "val", seq_len, batch_size, shuffle=False)
    if Tokenizer.from_file(str(Path(data_dir) / TOKENIZER_FILE)).get_vocab() != tokenizer.get_vocab():
        raise PiconeoxError(f"--eval-data {data_dir} was tokenized with another tokenizer than the checkpoint's: "
                            "evaluate on the dataset the model was trained on (or one prepared with its tokenizer)")
    return evaluate(model, loader.eval_batches(num_batches), next(model.parameters()).device)


@cli
def main(argv=None) -> int:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint folder: checkpoints/<run>/best, final or step-XXXXXXXX")
    p.add_argument("--prompt", default="Once upon a time")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40, help="0 = no top-k filtering")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-data", help="instead of sampling: val loss and perplexity on this prepared dataset")
    p.add_argument("--eval-batches", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args(argv)
    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--eval-batches", args.eval_batches),
                        ("--batch-size", args.batch_size)):
        if value < 1:
            raise PiconeoxError(f"{flag} {value}: must be a positive integer")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise PiconeoxError(f"--temperature {args.temperature}: must be a number >= 0 (0 = greedy)")
    if not 0 <= args.seed < 2**63:
        raise PiconeoxError(f"--seed {args.seed}: must be an integer from 0 to 2**63 - 1")
    if args.top_k < 0:
        raise PiconeoxError(f"--top-k {args.top_k}: must be an integer >= 0 (0 = no top-k filtering)")
    model, tokenizer = open_checkpoint(args.checkpoint)
    if args.eval_data:
        loss = evaluate_checkpoint(model, tokenizer, args.eval_data, model.config.max_position_embeddings,
                                   args.batch_size, args.eval_batches)
        print(f"val loss {loss:.4f}  perplexity {math.exp(loss):.2f}")
    else:
        unknown = sorted({c for c in args.prompt if c not in tokenizer.get_vocab()})
        if unknown and tokenizer_kind(tokenizer.backend_tokenizer) == "char":  # byte and BPE encode any text
            raise PiconeoxError(f"--prompt {args.prompt!r} has characters this checkpoint's tokenizer does not "
                                f"know ({', '.join(map(repr, unknown[:5]))}): they would be dropped silently")
        print(printable(sample_text(model, tokenizer, args.prompt, args.max_new_tokens, args.temperature,
                                    args.top_k or None, args.seed)))
    return 0


if __name__ == "__main__":
    exit_process(main())
