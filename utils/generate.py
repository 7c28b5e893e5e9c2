"""Sample text from a checkpoint, or report its validation loss and perplexity.

    python -m utils.generate checkpoints/<run>/best --prompt "Once upon a time" --max-new-tokens 200
    python -m utils.generate checkpoints/<run>/final --eval-data data/<name> [--eval-batches 50]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from utils.errors import CliParser, PiconeoxError
from utils.terminal import printable
from utils.tokenizers import tokenizer_kind


@torch.no_grad()
def sample_text(model, tokenizer, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
                top_k: int | None = 40, seed: int = 0) -> str:
    """Prompt plus `max_new_tokens` sampled tokens; the context is cropped to the model's positions."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    ids = tokenizer.encode(prompt, add_special_tokens=False) or [tokenizer.eos_token_id]
    x = torch.tensor([ids], dtype=torch.long, device=device)
    ctx = model.config.max_position_embeddings
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(max_new_tokens):
        logits = model(input_ids=x[:, -ctx:]).logits[0, -1].float().cpu()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits[logits < kth] = -math.inf
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        x = torch.cat([x, torch.tensor([[nxt]], device=device)], dim=1)
    model.train(was_training)
    return tokenizer.decode(x[0].tolist(), skip_special_tokens=False)


def readable_sample(text: str, eos: str | None, width: int = 100) -> str:
    """A sample as lines of at most `width` characters, each document on its own, `eos` on a line between them."""
    import textwrap

    parts = text.split(eos) if eos else [text]
    documents = ["\n".join(textwrap.fill(line, width) for line in part.strip().splitlines()) for part in parts]
    return f"\n{eos}\n".join(documents)


def load_checkpoint_model(folder: str):
    """Model and tokenizer of a checkpoint folder (best/, final/, step-XXXXXXXX/, or a run directory: its best/);
    files are checked against the marker's crc32c first."""
    from transformers import AutoTokenizer

    from utils.consolidate import load_model

    path = checkpoint_folder(folder)
    return load_model(path), AutoTokenizer.from_pretrained(str(path))


def checkpoint_folder(folder: str) -> Path:
    """The checkpoint folder the user means (a run directory: its best/); one line when there is none."""
    path = Path(folder)
    if not path.is_dir():
        what = "is a file, not a checkpoint folder" if path.exists() else "no such checkpoint folder"
        raise PiconeoxError(f"{folder}: {what} (give checkpoints/<run>/best, final or step-XXXXXXXX)")
    if not (path / "config.json").exists() and (path / "best").is_dir():
        path = path / "best"  # a run directory: its best weights
    if not (path / "COMPLETE").exists():
        raise PiconeoxError(no_checkpoint_here(path))
    return path


def no_checkpoint_here(path: Path) -> str:
    """Why the folder `path` (no COMPLETE marker) is not a checkpoint: a folder of runs, a run without best/, an
    interrupted save or something else."""
    subs = sorted(p.name for p in path.iterdir() if p.is_dir())
    runs = [s for s in subs if any((path / s / c).is_dir() for c in ("best", "final"))]
    steps = [s for s in subs if s.startswith("step-")]
    give = "give checkpoints/<run>/best, final or step-XXXXXXXX"
    if runs:
        return f"{path} is a folder of runs ({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''}), not a checkpoint: {give}"
    if steps:
        return f"{path} is a run folder without best/ or final/: give one of its steps, e.g. {path / steps[-1]}"
    if (path / "config.json").exists():
        return f"{path} has no COMPLETE marker (an interrupted save)"
    return f"{path} holds no checkpoint: {give}"


def evaluate_checkpoint(model, tokenizer, data_dir: str, seq_len: int, batch_size: int, num_batches: int) -> float:
    """Mean validation cross-entropy of `model` on a prepared dataset's val split, refused unless the
    dataset was tokenized with the checkpoint's tokenizer (other ids would give a meaningless number)."""
    from tokenizers import Tokenizer

    from utils.loader import BlockLoader
    from utils.tokenizers import TOKENIZER_FILE

    loader = BlockLoader(data_dir, "val", seq_len, batch_size, shuffle=False)
    if Tokenizer.from_file(str(Path(data_dir) / TOKENIZER_FILE)).get_vocab() != tokenizer.get_vocab():
        raise PiconeoxError(f"--eval-data {data_dir} was tokenized with another tokenizer than the checkpoint's: "
                            "evaluate on the dataset the model was trained on (or one prepared with its tokenizer)")
    model.eval()
    losses = []
    with torch.no_grad():
        for x, y in loader.eval_batches(num_batches):
            logits = model(input_ids=x).logits
            losses.append(torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)).item())
    if not losses:
        raise PiconeoxError(f"--eval-data {data_dir}: the val split has fewer than {batch_size} blocks of {seq_len} tokens")
    return sum(losses) / len(losses)


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
    try:
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
        model, tokenizer = load_checkpoint_model(args.checkpoint)
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
    except PiconeoxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
