"""Data-path throughput: demo generation, tokenization, loader, and loader vs a 10M-model train step.

    .venv/bin/python benchmarks/bench_data.py

Goals: the demo corpus generates in < 5 s; the loader feeds >= 50x the tokens/s that a training step
of a ~10M-parameter GPT-NeoX consumes at batch 8 x seq 256 (so data loading never limits training).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# one thread per tokenizer process, so workers=1 vs 2 compares one core with two
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from utils.data.prepare import prepare  # noqa: E402
from utils.data.demo_corpus import generate_stories  # noqa: E402
from utils.data.loader import BlockLoader  # noqa: E402
from utils.data.shards import read_manifest  # noqa: E402
from utils.errors import CliParser, cli  # noqa: E402

BATCH, SEQ = 8, 256
SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def bench_demo() -> None:
    text, seconds = timed(lambda: "".join(generate_stories()))
    print(f"demo corpus: {len(text.encode()) / 1e6:.2f} MB in {seconds:.2f} s (goal < 5 s)")


def bench_tokenize(out: Path) -> Path:
    """Prepare the demo and (when present) real text with each tokenizer; returns the demo dataset."""
    cases = [("demo", ["demo"], "byte", None)]
    if SHARED.is_dir():
        cases += [("stories-bpe", [str(SHARED / "tinystories")], "bpe", 4096),
                  ("shakespeare-char", [str(SHARED / "tinyshakespeare" / "input.txt")], "char", None)]
    for name, inputs, kind, vocab in cases:
        for workers in (1, 2):
            data, seconds = timed(lambda: prepare(inputs, f"{name}-{workers}", out, kind, vocab, workers=workers))
            m = read_manifest(data)
            tokens = sum(s.tokens for s in m.shards)
            print(f"prepare {name:17s} workers={workers}: {tokens:>10,} tokens in {seconds:5.2f} s = "
                  f"{tokens / seconds / 1e6:5.2f} M tok/s (tokenizer training included)")
    return out / "demo-2"


def bench_loader(data: Path, batches: int = 3000) -> float:
    loader = BlockLoader(data, "train", SEQ, BATCH, seed=0)
    next(loader)
    _, seconds = timed(lambda: [next(loader) for _ in range(batches)])
    rate = batches * BATCH * SEQ / seconds
    print(f"loader batch {BATCH} x seq {SEQ}: {rate / 1e6:.1f} M tok/s ({batches / seconds:,.0f} batches/s)")
    return rate


def bench_train_step(vocab_size: int, steps: int = 3) -> float:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    config = GPTNeoXConfig(vocab_size=vocab_size, hidden_size=320, num_hidden_layers=8, num_attention_heads=5,
                           intermediate_size=1280, max_position_embeddings=SEQ, use_cache=False)
    model = GPTNeoXForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, vocab_size, (BATCH, SEQ))

    def step():
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up
    seconds = statistics.median(timed(step)[1] for _ in range(steps))
    rate = BATCH * SEQ / seconds
    print(f"train step ({params / 1e6:.1f}M params, fp32, {torch.get_num_threads()} threads): "
          f"{rate:,.0f} tok/s (median of {steps})")
    return rate


@cli
def main(argv=None) -> int:
    CliParser(prog="bench_data.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
              ).parse_args(argv)  # no options: --help explains, anything else is one error line
    bench_demo()
    with tempfile.TemporaryDirectory() as tmp:
        demo = bench_tokenize(Path(tmp))
        loader_rate = bench_loader(demo)
        step_rate = bench_train_step(read_manifest(demo).vocab_size)
    ratio = loader_rate / step_rate
    print(f"ratio loader / train step: {ratio:,.0f}x (goal >= 50x: {'met' if ratio >= 50 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
