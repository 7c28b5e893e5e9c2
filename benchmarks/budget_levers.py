"""The levers of a budget recipe, measured on a held-out part of *train* (never on val): benchmarks/README.md's
"Levers for a budget" table.

    .venv/bin/python benchmarks/budget_levers.py --steps 550 \\
        --lever base= --lever "muon lr 0.02=train.muon_lr=0.02" --lever "2 layers=model.num_layers=2"

The text (default: Tiny Shakespeare) is cut as nanoGPT cuts it: its first 90% is what both trainers train on; that
part is cut 90/10 again (prepare_data.py --val-split tail), and the held-out loss is the loss on its last 10%
(200 x 12 seeded random 64-token windows, benchmarks/char_val_loss.py). Every lever runs the budget preset for the
same number of steps (--steps: what the budget affords at the preset's step cost), so a lever that keeps the step
cost is compared at equal wall time on any box and under any load; a lever that changes the step cost (the
model's width or depth) prints its measured ms per step too, and the README converts. One line per lever:

    muon lr 0.02: held-out 1.8412 (all of held-out 1.8390), 552 steps, 47.1 ms a step
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from utils.errors import CliParser, PiconeoxError, cli  # noqa: E402

PRESET = "shakespeare-char-budget"
RATE = re.compile(r"([\d,]+) tok/s")  # the evaluation lines' training speed


def lever(text: str) -> tuple[str, list[str]]:
    """`NAME=KEY=VALUE[,KEY=VALUE...]` (`NAME=` alone: the preset as it is) -> (name, --set arguments)."""
    name, _, sets = text.partition("=")
    if not name or not _:
        raise argparse.ArgumentTypeError(f"--lever {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE] or NAME=")
    return name, [s for s in sets.split(",") if s]


def step_tokens(levers: list[tuple[str, list[str]]], steps: int) -> list[int]:
    """Every lever's settings resolved now (a typo is one line before the first lever's run, not after it); each
    lever's tokens per optimizer step, from its resolved config."""
    from configs.presets import resolve_config

    tokens = []
    for name, sets in levers:
        pairs = dict(s.split("=", 1) if "=" in s else (s, "") for s in sets)
        if bad := [k for k, v in pairs.items() if not v]:
            raise PiconeoxError(f"--lever {name!r}: {bad[0]!r} has no value (expected KEY=VALUE)")
        tc = resolve_config(PRESET, overrides={**pairs, "train.time_budget_s": "0",
                                               "train.max_steps": str(steps)}).train
        tokens.append(tc.micro_batch_size * tc.grad_accum_steps * tc.seq_len)
    return tokens


def held_out_data(text: Path, work: Path) -> Path:
    """nanoGPT's train part of `text` (its first 90%), prepared with its own last 10% as the held-out split."""
    chars = text.read_text(encoding="utf-8")
    train = work / "train90.txt"
    train.write_text(chars[:int(len(chars) * 0.9)], encoding="utf-8")
    subprocess.run([sys.executable, "prepare_data.py", str(train), "--name", "held-out", "--out-dir",
                    str(work / "data"), "--tokenizer", "char", "--val-split", "tail"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    return work / "data" / "held-out"


def run_lever(name: str, sets: list[str], tokens: int, steps: int, data: Path, work: Path, seed: int) -> str:
    run = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "base"
    args = [sys.executable, "train.py", "--config", PRESET, "--data", str(data), "--output-dir", str(work / "ckpt"),
            "--log-dir", str(work / "logs"), "--run-name", run, "--sample-tokens", "0",
            "--set", "train.time_budget_s=0", "--set", f"train.max_steps={steps}", "--set", f"train.seed={seed}"]
    for s in sets:
        args += ["--set", s]
    start = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PiconeoxError(f"lever {name!r} failed (exit {done.returncode}): {last}")
    rates = [int(r.replace(",", "")) for r in RATE.findall((work / "logs" / run / "training.log").read_text())]
    scores = subprocess.run([sys.executable, "benchmarks/char_val_loss.py", "piconeox",
                             str(work / "ckpt" / run / "final"), str(data)], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    step_ms = f"{tokens / rates[-1] * 1e3:.1f} ms a step" if rates else "step cost not logged"
    return f"{name}: held-out {scores[-2]} (all of held-out {scores[-1]}), {steps} steps, {step_ms}, {wall:.1f} s wall"


@cli
def main(argv=None) -> int:
    p = CliParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, required=True, help="steps for every lever (what the budget affords)")
    p.add_argument("--lever", type=lever, action="append", required=True, help="NAME=KEY=VALUE[,KEY=VALUE] or NAME=")
    p.add_argument("--text", type=Path, default=ROOT.parent / "shared/data/tinyshakespeare/input.txt")
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args(argv)
    if not args.text.is_file():
        raise PiconeoxError(f"--text {args.text}: no such file (see ../shared/data/PROVENANCE.md)")
    if args.steps < 1:
        raise PiconeoxError(f"--steps {args.steps}: expected a positive number of steps")
    tokens = step_tokens(args.lever, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = held_out_data(args.text, work)
        for (name, sets), n in zip(args.lever, tokens):
            print(run_lever(name, sets, n, args.steps, data, work, args.seed), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
