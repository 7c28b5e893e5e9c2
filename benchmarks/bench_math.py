"""Training-step time per preset for each attention implementation x float32 matmul precision, on this machine.

    .venv/bin/python benchmarks/bench_math.py [--presets pico-best,shakespeare-char] [--rounds 6] [--steps 40]

The settings change how the math runs, not the model; which pair is fastest depends on the CPU (oneDNN vs
MKL kernels) and the shapes (eager attention grows with the context). Steps (forward, backward, clip, AdamW) on
random tokens at the preset's micro batch and context; every combination keeps its own model and optimizer,
and the rounds interleave them so that machine noise falls on all alike. Printed: ms per step and the speed-up
over the defaults (sdpa, highest).
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs.training import ATTENTION, MATMUL_PRECISION  # noqa: E402
from utils.errors import CliParser, PiconeoxError, at_least, cli  # noqa: E402

CHAR_VOCAB = 66  # Tiny Shakespeare's 65 characters + end-of-text


def step_times(preset: str, rounds: int, steps: int) -> dict[tuple[str, str], float]:
    """ms per training step for every (attention, matmul precision) pair, interleaved over `rounds`."""
    import torch

    from configs.model import build_model
    from configs.presets import resolve_config
    from utils.lm import lm_loss
    from utils.optim import build_optimizer

    cfg = resolve_config(preset, None, {})
    tc = cfg.train
    vocab = {"char": CHAR_VOCAB, "byte": 257}.get(tc.tokenizer, tc.tokenizer_vocab)
    torch.manual_seed(tc.seed)
    x = torch.randint(0, vocab, (tc.micro_batch_size, tc.seq_len))
    y = torch.randint(0, vocab, (tc.micro_batch_size, tc.seq_len))
    runs = {}
    for attention in ATTENTION:
        model = build_model(cfg.model.with_vocab(vocab), attn_implementation=attention)
        runs[attention] = (model, build_optimizer(model, tc.learning_rate, tc.weight_decay, (tc.beta1, tc.beta2)))

    def step(model, optimizer) -> None:
        lm_loss(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    previous = torch.get_float32_matmul_precision()
    seconds = dict.fromkeys(itertools.product(ATTENTION, MATMUL_PRECISION), 0.0)
    try:
        for _ in range(rounds):
            for attention, precision in seconds:
                torch.set_float32_matmul_precision(precision)
                for _ in range(3):  # warm-up: the kernels of this precision
                    step(*runs[attention])
                start = time.perf_counter()
                for _ in range(steps):
                    step(*runs[attention])
                seconds[(attention, precision)] += time.perf_counter() - start
    finally:
        torch.set_float32_matmul_precision(previous)
    return {pair: s / (rounds * steps) * 1e3 for pair, s in seconds.items()}


@cli
def main(argv=None) -> int:
    from configs.presets import PRESET_NAMES

    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="pico-best,pico-fast,shakespeare-char", help="comma-separated preset names")
    p.add_argument("--rounds", type=at_least(1), default=6, help="interleaved rounds over all pairs")
    p.add_argument("--steps", type=at_least(1), default=40, help="timed steps per pair per round")
    args = p.parse_args(argv)
    presets = [name.strip() for name in args.presets.split(",") if name.strip()]
    if not presets:
        raise PiconeoxError(f"--presets {args.presets!r} names no preset: give comma-separated names, e.g. pico-best")
    for name in presets:
        if name not in PRESET_NAMES or name == "production":
            raise PiconeoxError(f"--presets: {name!r} is not a CPU-sized preset; allowed: "
                                f"{', '.join(n for n in PRESET_NAMES if n != 'production')}")
    print("| preset | attention | matmul precision | ms/step | speed-up vs sdpa + highest |")
    print("|---|---|---|---|---|")
    for name in presets:
        times = step_times(name, args.rounds, args.steps)
        base = times[("sdpa", "highest")]
        for (attention, precision), ms in times.items():
            print(f"| {name} | {attention} | {precision} | {ms:.1f} | {base / ms:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
