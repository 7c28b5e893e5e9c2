"""RP2040 runtime on an emulated Pico (real MicroPython firmware in rp2040js): tok/s, per-token time
(forward pass, sampling) and heap, for every preset and dtype.

    .venv/bin/python benchmarks/bench_rp2040.py [--tokens 8] [--presets rp2040-speed,...] [--dtypes int8,f32]
        [--prompt "Once upon a time"] [--firmware UF2]

Times are emulated at 125 MHz, so they are the same on any host under any load (rp2040/emulate.py).
Models are the presets at a wide random init (speed does not depend on the weights) with the byte
tokenizer, exported by rp2040.export with its default RAM/flash choice; sampling is config.json's
default (temperature 0.8, top-k 40, seed 0). Emulation costs ~10 s of wall time per emulated second:
f32 models take minutes.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from configs.presets import preset_list  # noqa: E402
from rp2040 import emulate  # noqa: E402
from rp2040.export import export  # noqa: E402
from tests.support.rp2040_models import save_checkpoint  # noqa: E402  (the tests' wide random init)
from utils.errors import CliParser, PiconeoxError, at_least, cli  # noqa: E402


@cli
def main(argv=None) -> int:
    ap = CliParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=at_least(1), default=8, help="tokens generated per model (default 8)")
    ap.add_argument("--presets", type=preset_list, default="rp2040-speed,rp2040-optimized,rp2040-quality")
    ap.add_argument("--dtypes", default="int8,f32")
    ap.add_argument("--prompt", default=emulate.DEFAULT_PROMPT)
    ap.add_argument("--firmware", type=Path)
    args = ap.parse_args(argv)
    if emulate.unavailable() and args.firmware is None:
        raise PiconeoxError(emulate.unavailable())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            ckpt = save_checkpoint(preset, Path(tmp) / preset)[0]
            for dtype in args.dtypes.split(","):
                out = Path(tmp) / f"{preset}-{dtype}"
                cfg = export(ckpt, out, dtype, force=True)
                print(f"==> {preset} {dtype}", file=sys.stderr)
                try:
                    run = emulate.emulate(out, args.prompt, args.tokens, args.firmware)
                except PiconeoxError as e:
                    rows.append((preset, dtype, cfg, None, str(e)))
                    continue
                same = emulate.host_ids(out, run.prompt_ids, args.tokens) == run.ids
                rows.append((preset, dtype, cfg, run, "yes" if same else "NO"))
    print(f"\nemulated Pico (MicroPython v1.28 RPI_PICO, 125 MHz), prompt {args.prompt!r}, {args.tokens} tokens\n")
    print("| model | weights | model.bin | forward ms/token | sampling ms | step ms | tok/s | heap free after load "
          "(predicted) | heap min | ids = host |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for preset, dtype, cfg, run, same in rows:
        where = "flash" if cfg["runtime"]["stream"] else "RAM"
        size = f"{cfg['files']['model.bin']:,}"
        if run is None:
            print(f"| {preset} {dtype} | {where} | {size} | failed: {same} |")
            continue
        print(f"| {preset} {dtype} | {where} | {size} | {run.step_ms - run.sample_ms:.1f} | {run.sample_ms:.1f} "
              f"({100 * run.sample_ms / run.step_ms:.0f}%) | {run.step_ms:.1f} | {run.tok_per_s:.2f} | "
              f"{run.heap_loaded:,} ({cfg['ram']['free_after_load_bytes']:,}) | {run.heap_min:,} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
