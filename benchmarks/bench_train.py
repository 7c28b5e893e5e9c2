"""train.py's training throughput against a bare forward/backward/step loop, in one run.

    .venv/bin/python benchmarks/bench_train.py [--steps 40] [--preset test] [--seq-len 256] [--batch-size 8]

Both sides train the same model shape on the same batch shape with the same optimizer; the bare loop
has no data loader, no accelerate, no logging. Prints tokens/s of each and the ratio (goal >= 0.95).
The first steps of each side are warm-up and not timed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from configs.presets import resolve_config  # noqa: E402
from configs.model import build_model  # noqa: E402
from utils.data.prepare import prepare  # noqa: E402
from utils.lm import lm_loss  # noqa: E402
from utils.optim import build_optimizer  # noqa: E402
from utils.errors import CliParser, at_least, cli  # noqa: E402

WARMUP = 5


def bare_loop(cfg, steps: int, attention: str = "sdpa") -> float:
    """Median seconds per step of the plainest loop: random tokens, forward, loss, backward, AdamW step."""
    torch.manual_seed(0)
    model = build_model(cfg.model)
    model.set_attn_implementation(attention)
    opt = build_optimizer(model, cfg.train.learning_rate, cfg.train.weight_decay, (0.9, 0.95))
    tc = cfg.train
    times = []
    for _ in range(WARMUP + steps):
        x = torch.randint(0, cfg.model.vocab_size, (tc.micro_batch_size, tc.seq_len))
        t0 = time.perf_counter()
        loss = lm_loss(model, x, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[WARMUP:])


def trainer_loop(args, data: Path, out: Path) -> float:
    """Median seconds per step as train.py measures it (loader, accelerate, clipping, logging included)."""
    # train.py as users run it, in its own process (the bare loop runs in this one, after it)
    subprocess.run([sys.executable, str(REPO / "train.py"), "--config", args.preset, "--data", str(data),
                    "--max-steps", str(WARMUP + args.steps), "--seq-len", str(args.seq_len), "--batch-size",
                    str(args.batch_size), "--eval-every", "100000", "--save-every", "100000", "--log-every", "1",
                    "--output-dir", str(out / "ckpt"), "--log-dir", str(out / "logs"), "--run-name", "bench",
                    "--sample-prompt", "a"], check=True)
    history = json.loads((out / "logs" / "bench" / "history.json").read_text())
    return statistics.median([h["train/step_time_s"] for h in history if "train/step_time_s" in h][WARMUP:])


@cli
def main(argv=None) -> None:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=at_least(WARMUP + 1), default=40)
    p.add_argument("--preset", default="test")
    p.add_argument("--seq-len", type=at_least(1), default=256)
    p.add_argument("--batch-size", type=at_least(1), default=8)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        data = prepare(["demo"], name="bench", out_dir=out, tokenizer="byte", dataset_percent=20)
        cfg = resolve_config(args.preset, None,
                             {"train.seq_len": args.seq_len, "train.micro_batch_size": args.batch_size})
        cfg = type(cfg)(cfg.preset, cfg.model.with_vocab(256), cfg.train)
        tokens = args.seq_len * args.batch_size
        t_trainer = trainer_loop(args, data, out)
        t_bare = bare_loop(cfg, args.steps)
    print(f"\nmodel {args.preset}, batch {args.batch_size} x {args.seq_len} tokens, {torch.get_num_threads()} "
          f"threads, median of {args.steps} steps")
    print(f"bare loop  {tokens / t_bare:10,.0f} tok/s  ({t_bare * 1000:.1f} ms/step)")
    print(f"train.py   {tokens / t_trainer:10,.0f} tok/s  ({t_trainer * 1000:.1f} ms/step)")
    print(f"ratio train.py / bare = {t_bare / t_trainer:.3f}  (goal >= 0.95)")


if __name__ == "__main__":
    sys.exit(main())
