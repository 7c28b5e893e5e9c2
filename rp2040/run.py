"""Run an exported model on the host with the same runtime code the board runs.

    python -m rp2040.run models/<name> --prompt "Once upon a time" [--max-new-tokens 64]
        [--temperature 0.8] [--top-k 40] [--seed 0] [--stream]

Defaults come from the model's config.json ("generation"), as on the board.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from rp2040.bundle import check_model, model_files
from rp2040.prompt import check_prompt, context_stop, model_config
from rp2040.runtime.generate import prompt_ids, run_session
from rp2040.runtime.modelfile import FormatError
from rp2040.runtime.tokenizer import Tokenizer
from utils.errors import CliParser, PiconeoxError
from utils.textfile import printable


def main(argv: list[str] | None = None) -> int:
    ap = CliParser(prog="python -m rp2040.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="an exported model, e.g. models/<name>")
    ap.add_argument("--prompt", default="", help="text to continue (empty: start from end-of-text)")
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--temperature", type=float, help="0 = greedy")
    ap.add_argument("--top-k", type=int, help="0 = all tokens")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--stream", action="store_true",
                    help="read each layer from the file per token, as a board short of RAM does")
    args = ap.parse_args(argv)
    try:
        check_model(model_files(args.model_dir)["/model/model.bin"])  # a lying header is one line, before any work
        config = model_config(args.model_dir)
        check_prompt(config, args.prompt)
        if args.max_new_tokens is not None and args.max_new_tokens < 1:
            raise PiconeoxError(f"--max-new-tokens {args.max_new_tokens} must be >= 1")
        if args.temperature is not None and not (math.isfinite(args.temperature) and args.temperature >= 0):
            raise PiconeoxError(f"--temperature {args.temperature} must be a finite number >= 0 (0 = greedy)")
        if args.seed is not None and not 0 <= args.seed < 2**32:
            raise PiconeoxError(f"--seed {args.seed} must be an integer from 0 to 2**32 - 1")
        if args.top_k is not None and args.top_k < 0:
            raise PiconeoxError(f"--top-k {args.top_k} must be >= 0 (0 = all tokens)")
        out, _ = run_session(str(args.model_dir), args.prompt, args.max_new_tokens, args.temperature, args.top_k,
                             args.seed, stream=True if args.stream else None,
                             write=lambda s: print(printable(s), end="", flush=True))
        context = config["shape"]["context"]
        prompt_tokens = len(prompt_ids(Tokenizer(str(args.model_dir / "vocab.bin")), args.prompt, context))
        if note := context_stop(args.max_new_tokens or config["generation"]["max_new_tokens"], len(out),
                                prompt_tokens, context):
            print(note)
    except (PiconeoxError, FormatError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
