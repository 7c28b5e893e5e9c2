"""Search Pico model shapes on TinyStories: train each briefly, then measure val loss and emulated speed.

    .venv/bin/python benchmarks/pico_search.py [--base pico-best] [--shapes h24-l3-a4-f96-c64 ...]
        [--steps 1500] [--lr 5e-3] [--jobs 2] [--out /tmp/pico-search]

A shape is hidden-layers-heads-ffn-context (`h24-l3-a4-f96-c64`) on the base preset: its vocab (so every
val loss is per token of one tokenizer), tied embeddings, rotary and training recipe, with the shape's
context as seq_len and --steps/--lr as given. --jobs trainings run at once, one thread each. Every trained
shape is exported int8 and run on the emulated Pico (`rp2040.emulate`: real firmware, cycles at 125 MHz,
so tok/s is deterministic); val loss is over all of TinyStories' validation file. The table lists shapes by
val loss; `*` marks the Pareto front (no other shape has both lower loss and higher tok/s). A shape whose
run already finished under --out is reused, so a search can grow a few shapes at a time.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.pico_tinystories import PROMPT, TINYSTORIES, dataset, val_metrics  # noqa: E402
from configs.presets import MODEL_PRESETS, TRAIN_PRESETS  # noqa: E402
from rp2040.emulate import emulate, unavailable  # noqa: E402
from utils.ckpt.format import MARKER  # noqa: E402
from utils.errors import CliParser, PiconeoxError, at_least, cli  # noqa: E402

SHAPE = re.compile(r"^h(\d+)-l(\d+)-a(\d+)-f(\d+)-c(\d+)$")
# rp2040-quality's shape and shapes whose int8 weights stay in RAM at vocab 1024 (model.bin under ~60 KB, so
# the exporter keeps >= 100 KB of heap free; streamed weights cost speed): width vs depth vs FFN, head count
# (head dim >= 2 and even, for RoPE) and context.
DEFAULT_SHAPES = ("h12-l4-a6-f384-c64 h24-l3-a4-f96-c64 h24-l3-a2-f96-c64 h24-l4-a4-f64-c64 h24-l4-a2-f64-c64 "
                  "h24-l5-a4-f32-c64 h24-l2-a4-f160-c64 h20-l5-a2-f80-c64 h20-l4-a5-f100-c64 h16-l6-a4-f64-c64 "
                  "h16-l4-a4-f192-c64 h28-l2-a2-f96-c64 h32-l2-a4-f48-c64 h24-l3-a4-f96-c128").split()


def parse_shape(text: str) -> dict[str, int]:
    if not (m := SHAPE.match(text)):
        raise PiconeoxError(f"shape {text!r} is not hidden-layers-heads-ffn-context like h24-l3-a4-f96-c64")
    h, layers, heads, ffn, ctx = map(int, m.groups())
    return {"hidden_size": h, "num_layers": layers, "num_heads": heads, "intermediate_size": ffn,
            "max_position_embeddings": ctx}


def run_shape(shape: str, args, data: Path) -> dict:
    """Train (unless finished before), export int8, emulate, evaluate: one result row."""
    name = f"{shape}-s{args.steps}-lr{args.lr:g}"
    run, model_dir, log = args.out / "ckpt" / name, args.out / "models" / name, args.out / "logs" / f"{name}.log"
    if not (run / "final" / MARKER).exists():
        dims = parse_shape(shape)
        sets = [f"model.{k}={v}" for k, v in dims.items()]
        cmd = [sys.executable, "train.py", "--config", args.base, "--data", str(data), "--output-dir",
               str(args.out / "ckpt"), "--log-dir", str(args.out / "logs"), "--run-name", name, "--report-to", "none",
               "--max-steps", str(args.steps), "--lr", str(args.lr), "--seq-len", str(dims["max_position_embeddings"]),
               *[a for s in sets for a in ("--set", s)]]
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            done = subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode:
            raise PiconeoxError(f"training {name} failed (exit {done.returncode}); see {log}")
    subprocess.run([sys.executable, "-m", "rp2040.export", str(run / "final"), "--out", str(model_dir),
                    "--dtype", "int8"],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    e = emulate(model_dir, PROMPT, args.tokens, progress=False)
    loss, bpb = val_metrics(run / "final", data)
    return {"shape": shape, "steps": args.steps, "lr": args.lr, "val_loss": loss, "bits_per_byte": bpb,
            "tok_per_s": e.tok_per_s, "heap_free": e.heap_loaded, "streamed": e.stream,
            "bytes": (model_dir / "model.bin").stat().st_size, "train_seconds": train_seconds(log)}


def train_seconds(log: Path) -> int | None:
    """Seconds from the run's first to its last log line (None without a log: a run reused from elsewhere)."""
    stamps = re.findall(r"^\d{4}-\d\d-\d\d (\d\d):(\d\d):(\d\d)", log.read_text(), re.M) if log.exists() else []
    if len(stamps) < 2:
        return None
    first, last = (int(h) * 3600 + int(m) * 60 + int(s) for h, m, s in (stamps[0], stamps[-1]))
    return (last - first) % 86400


def table(rows: list[dict]) -> str:
    rows = sorted(rows, key=lambda r: r["val_loss"])
    lines = ["| | shape (hidden-layers-heads-ffn-ctx) | steps | lr | val loss | bits/byte | tok/s (emulated) | "
             "heap free | model.bin | train s (1 thread) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        front = not any(o["val_loss"] < r["val_loss"] and o["tok_per_s"] > r["tok_per_s"] for o in rows)
        heap = f"{r['heap_free']:,}" + (" (streamed)" if r["streamed"] else "")
        lines.append(f"| {'*' if front else ''} | `{r['shape']}` | {r['steps']} | {r['lr']:g} | {r['val_loss']:.3f} | "
                     f"{r['bits_per_byte']:.3f} | {r['tok_per_s']:.1f} | {heap} | {r['bytes']:,} | "
                     f"{r['train_seconds'] or 'n/a'} |")
    return "\n".join(lines)


@cli
def main(argv: list[str] | None = None) -> int:
    ap = CliParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="pico-best",
                    choices=[p for p in MODEL_PRESETS if p.startswith(("rp2040", "pico"))])
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, metavar="hH-lL-aA-fF-cC")
    ap.add_argument("--steps", type=at_least(1), default=1500)
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the base preset's)")
    ap.add_argument("--jobs", type=at_least(1), default=2, help="trainings at once, one thread each (default 2)")
    ap.add_argument("--tokens", type=at_least(1), default=16, help="tokens generated on the emulated Pico")
    ap.add_argument("--out", type=Path, default=Path("/tmp/pico-search"))
    ap.add_argument("--train", type=Path, default=TINYSTORIES / "tinystories_10k.txt")
    ap.add_argument("--val", type=Path, default=TINYSTORIES / "tinystories_val.txt")
    args = ap.parse_args(argv)
    if args.lr is not None and not args.lr > 0:
        ap.error(f"--lr {args.lr}: must be above 0")
    print(search(args))
    return 0


def search(args) -> str:
    """Check every shape, train and measure the new ones, and return the table of all results under --out."""
    for shape in args.shapes:
        replace(MODEL_PRESETS[args.base], **parse_shape(shape)).validate()
    if not (args.train.is_file() and args.val.is_file()):
        raise PiconeoxError(f"{args.train} or {args.val} not found (see ../shared/data/PROVENANCE.md)")
    if why := unavailable():
        raise PiconeoxError(f"the emulated Pico is needed for tok/s: {why}")
    args.lr = args.lr or TRAIN_PRESETS[args.base].learning_rate
    torch.set_num_threads(1)
    data = dataset(args.base, args.train, args.val, args.out / "data")
    results = args.out / "results.jsonl"
    with ThreadPoolExecutor(args.jobs) as pool:
        for row in pool.map(lambda s: run_shape(s, args, data), args.shapes):
            print(f"{row['shape']}: val loss {row['val_loss']:.3f}, {row['tok_per_s']:.1f} tok/s", flush=True)
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
    rows = {(r["shape"], r["steps"], r["lr"]): r for r in map(json.loads, results.read_text().splitlines())}
    return (f"\nTinyStories, {args.base}'s vocab ({MODEL_PRESETS[args.base].vocab_size} BPE) and recipe; all "
            f"results in {results}:\n\n{table(list(rows.values()))}")

if __name__ == "__main__":
    sys.exit(main())
