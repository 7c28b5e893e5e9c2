"""RP2040 runtime: tokens/s in MicroPython (WebAssembly) and CPython, file sizes, heap per preset and dtype.

    .venv/bin/python benchmarks/bench_rp2040.py [--tokens 48] [--presets rp2040-speed,...]

Models are random-init presets with the byte tokenizer (speed does not depend on the weights).
MicroPython runs one token per call (see rp2040/harness.mjs): "live" is the heap in use at the start
of a call with all earlier garbage collected, "alloc/token" what one token allocates (garbage the GC
reclaims). Every buffer is preallocated, so the largest live heap during generation is the largest
"live" seen at a token boundary. The WebAssembly port runs on this PC: its tokens/s are not a Pico's.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqdm import tqdm  # noqa: E402

from configs.model import MODEL_PRESETS, build_model  # noqa: E402
from rp2040 import wasm  # noqa: E402
from rp2040.export import export  # noqa: E402
from rp2040.runtime.generate import Generator, clock, load  # noqa: E402
from rp2040.runtime.sampling import Sampler  # noqa: E402
from utils.tokenizers import build_tokenizer, save_tokenizer  # noqa: E402

PROMPT = [72, 101, 108, 108, 111]


def cpython_rate(model_dir: Path, n: int, stream: bool) -> float:
    model, _, _ = load(str(model_dir), stream)
    gen = Generator(model, Sampler(model.h.vocab))
    gen.prompt(PROMPT)
    start = clock()
    for _ in range(n):
        gen.step()
    return n / (clock() - start)


def micropython_run(model_dir: Path, n: int, stream: bool) -> dict:
    calls = [("from piconeox.generate import load, Generator\nfrom piconeox.sampling import Sampler\n"
              f"model, tok, cfg = load('/model', {stream})\ngen = Generator(model, Sampler(model.h.vocab))"),
             f"gen.prompt({PROMPT})"] + ["gen.step()"] * n
    res = wasm.run(calls, model_dir, mpy=True)
    tokens = res[2:]
    return {
        "live_after_load": res[1].live_bytes,
        "peak_live": max(r.live_bytes for r in tokens),
        "alloc_per_token": sum(r.alloc_bytes for r in tokens) / n,
        "rate": n / (sum(r.ms for r in tokens) / 1000),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=48, help="tokens generated per measurement")
    ap.add_argument("--presets", default="rp2040-speed,rp2040-optimized,rp2040-quality")
    args = ap.parse_args()
    if wasm.unavailable():
        sys.exit(f"error: {wasm.unavailable()}")
    presets = args.presets.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(p, d, s) for p in presets for d in ("int8", "f32") for s in (False, True)]
        for preset, dtype, stream in tqdm(jobs, desc="presets x dtype x streaming", unit="run"):
            ckpt = Path(tmp) / preset
            if not ckpt.exists():
                build_model(MODEL_PRESETS[preset]).save_pretrained(ckpt)
                save_tokenizer(build_tokenizer("byte", [], None), ckpt / "tokenizer.json")
            out = Path(tmp) / f"{preset}-{dtype}"
            cfg = export(ckpt, out, dtype, force=True)
            mp = micropython_run(out, args.tokens, stream)
            rows.append((preset, dtype, stream, cfg, mp, cpython_rate(out, args.tokens, stream)))
    print(f"\n{args.tokens} tokens after a {len(PROMPT)}-token prompt; MicroPython = WebAssembly port, runtime as .mpy\n")
    head = (f"{'preset':17} {'dtype':5} {'layers':8} {'model.bin':>10} {'vocab.bin':>9} {'est. RAM':>9} "
            f"{'live load':>10} {'peak live':>10} {'alloc/tok':>10} {'MP tok/s':>9} {'Py tok/s':>9} {'Py/MP':>6}")
    print(head)
    print("-" * len(head))
    for preset, dtype, stream, cfg, mp, py in rows:
        est = cfg["ram"]["streamed_bytes" if stream else "in_ram_bytes"]
        print(f"{preset:17} {dtype:5} {'flash' if stream else 'RAM':8} {cfg['files']['model.bin']:>10,} "
              f"{cfg['files']['vocab.bin']:>9,} {est / 1024:>7.1f}KB {mp['live_after_load'] / 1024:>8.1f}KB "
              f"{mp['peak_live'] / 1024:>8.1f}KB {mp['alloc_per_token'] / 1024:>8.1f}KB {mp['rate']:>9.1f} "
              f"{py:>9.1f} {py / mp['rate']:>6.1f}")
    by = {(p, d, s): mp["rate"] for p, d, s, _, mp, _ in rows}
    for preset in presets:
        print(f"{preset}: int8 / f32 MicroPython speed = {by[(preset, 'int8', False)] / by[(preset, 'f32', False)]:.2f}x")


if __name__ == "__main__":
    main()
