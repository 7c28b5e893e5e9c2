"""Checkpoint -> models/<name>/{model.bin, vocab.bin, config.json}: the only writer of rp2040/FORMAT.md (the bytes
are encoded by rp2040/model_bin.py and rp2040/vocab_bin.py).

    python -m rp2040.export CHECKPOINT_OR_HF_DIR --out models/<name> [--dtype f32|int8]
        [--ram-budget-kb 180] [--min-free-kb 100] [--force]

Reads the shape from the checkpoint's config (never a preset), quantizes matrices to int8 with one
scale per row when asked, predicts the heap the runtime will use on the board from measurements of
the real firmware, keeps the weights in RAM only when that leaves --min-free-kb free (else the runtime
streams them from flash), and refuses a model over the budget unless --force. Files are written
atomically, and only after all checks pass.
"""
from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

from rp2040 import blockfile
from rp2040.bundle import MODEL_FILES
from rp2040.model_bin import Shape, encode_model
from rp2040.runtime import modelfile as mf
from rp2040.runtime import tokenizer as vf
from rp2040.runtime.gpt import buffer_bytes, plan_buffers
from rp2040.runtime.xip import RAW_BYTES
from rp2040.vocab_bin import Vocab
from utils.atomic import atomic_dir, atomic_write_json, check_output_dir
from utils.ckpt.read import find_checkpoint
from utils.errors import CliParser, PiconeoxError, cli, exit_process
from utils.diskfull import one_line_when_full
from utils.textfile import read_json

DEFAULT_RAM_BUDGET_KB = 180
DEFAULT_MIN_FREE_KB = 100
# Measured on MicroPython v1.28.0 for RPI_PICO (245,888-byte GC heap) with `python -m rp2040.emulate`
# (its probe prints both): the heap free once main.py has imported the runtime, and what loading a
# model and making its sampler take beyond the buffers (gpt.plan_buffers) and the bytes of vocab.bin
# (the tokenizer keeps about that much): array and object headers, GC block rounding, the sampler's
# tables. 5,160-5,290 bytes over the three presets. Re-measure when the runtime's code changes (the asm_thumb
# kernels' native code took about 900 bytes more of the heap, the interleaved matvec4 2.4 KB more, the viper
# embed/residual and xip.py 1.8 KB more).
BOARD_HEAP_FREE_BYTES = 202_656
LOAD_OVERHEAD_BYTES = 5_200
# What reading the weights from littlefs blocks takes beside the planned buffers (runtime/lfsblocks.py's code and
# its per-block address arrays): pico-million's measured heap free after load, 29,008 bytes, against 38,572 planned.
BLOCKS_BYTES = 9_600
GENERATION_DEFAULTS = {"max_new_tokens": 64, "temperature": 0.8, "top_k": 40, "seed": 0}


def ram_estimate(model_bin: bytes, vocab_bin: bytes, stream: bool, xip: bool = False) -> int:
    """Bytes of heap loading the model takes on the board: planned buffers + tokenizer + measured overhead."""
    header = mf.Header(model_bin[:mf.HEADER_SIZE])
    layout = mf.Layout(header)
    return buffer_bytes(plan_buffers(header, layout, stream, xip)) + len(vocab_bin) + LOAD_OVERHEAD_BYTES


def in_place(model_bin: bytes) -> dict | None:
    """config.json's runtime["xip"] when the board can read this model.bin in place from raw flash (int8, every
    matrix interleaved, within the region before littlefs: rp2040/runtime/xip.py), else None."""
    h = mf.Header(model_bin[:mf.HEADER_SIZE])
    shapes = ((h.vocab, h.hidden), (3 * h.hidden, h.hidden), (h.hidden, h.inter), (h.inter, h.hidden))
    if not all(h.interleaved(r, c) for r, c in shapes) or len(model_bin) > RAW_BYTES:
        return None
    return {"bytes": len(model_bin), "crc32": int.from_bytes(model_bin[-4:], "little")}


def export(checkpoint: Path, out: Path, dtype: str = "int8", ram_budget_kb: int = DEFAULT_RAM_BUDGET_KB,
           force: bool = False, min_free_kb: int = DEFAULT_MIN_FREE_KB, in_place_always: bool = False) -> dict:
    """Export a checkpoint; returns the config.json written. Raises PiconeoxError (nothing written) on refusal."""
    if dtype not in mf.DTYPE_NAMES:
        raise PiconeoxError(f"--dtype {dtype!r} is not allowed; use one of {', '.join(mf.DTYPE_NAMES)}")
    if ram_budget_kb <= 0:
        raise PiconeoxError(f"--ram-budget-kb {ram_budget_kb} must be a positive number of KB")
    if min_free_kb < 0:
        raise PiconeoxError(f"--min-free-kb {min_free_kb} must be >= 0")
    check_output_dir(out, "--out", is_export, "an exported model")
    src = find_checkpoint(checkpoint)
    if not (src / "tokenizer.json").is_file():
        raise PiconeoxError(f"{src} has no tokenizer.json: the device needs it to encode and decode text")
    from transformers.utils import logging as hf_logging

    from utils.ckpt.read import load_model, tokenizer_problem  # heavy: only once the arguments are known good

    hf_logging.disable_progress_bar()  # a 1-second load needs no bar; stderr stays one line on error
    model = load_model(src)  # checked against the marker's crc32c when there is one
    shape = Shape.from_hf(model.config)
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    model_bin = encode_model(state, shape, dtype)
    if why := tokenizer_problem(src / "tokenizer.json", shape.vocab):  # bounded before it is parsed whole
        raise PiconeoxError(why)
    vocab = Vocab.from_tokenizer_json(src / "tokenizer.json", shape.vocab)
    vocab_bin = vocab.encode()
    budget = ram_budget_kb * 1024
    in_ram, streamed = ram_estimate(model_bin, vocab_bin, False), ram_estimate(model_bin, vocab_bin, True)
    # Weights in RAM only while the board keeps --min-free-kb of its measured heap after loading.
    stream = BOARD_HEAP_FREE_BYTES - in_ram < min_free_kb * 1024
    # What would stream reads its weights in place from raw flash instead, when it can (no copy, no buffer).
    xip = in_place(model_bin) if stream or in_place_always else None
    if in_place_always and not xip:
        raise PiconeoxError(f"--in-place: {src.name} cannot be read in place (int8 with every matrix in 4-row "
                            f"blocks, model.bin at most {RAW_BYTES:,} bytes)")
    # Too large for the gap: read in place from model.blk's littlefs blocks instead (rp2040/blockfile.py).
    blocks = blockfile.spec(model_bin) if stream and not xip else None
    if xip or blocks:
        stream, streamed = False, ram_estimate(model_bin, vocab_bin, False, xip=True) + (BLOCKS_BYTES if blocks else 0)
    estimate = streamed if stream or xip or blocks else in_ram
    if estimate > min(budget, BOARD_HEAP_FREE_BYTES) and not force:
        raise PiconeoxError(f"{src.name} as {dtype} needs about {estimate // 1024} KB of heap "
                            f"(even streaming layers from flash), over the {ram_budget_kb} KB budget or the "
                            f"{BOARD_HEAP_FREE_BYTES // 1024} KB a Pico has free; use "
                            f"{'' if dtype == 'int8' else '--dtype int8, '}a smaller model, --ram-budget-kb, "
                            "or --force")
    config = {
        "format": {"model.bin": mf.VERSION, "vocab.bin": vf.VERSION},
        "source": str(src),
        "dtype": dtype,
        "shape": asdict(shape),
        "tokenizer": {"kind": vocab.kind, "eos": vocab.eos},
        "files": {"model.bin": len(model_bin), "vocab.bin": len(vocab_bin)},
        "ram": {"estimate_bytes": estimate, "in_ram_bytes": in_ram, "streamed_bytes": streamed,
                "budget_bytes": budget, "board_heap_free_bytes": BOARD_HEAP_FREE_BYTES,
                "free_after_load_bytes": BOARD_HEAP_FREE_BYTES - estimate, "min_free_bytes": min_free_kb * 1024},
        "runtime": {"stream": stream, **({"xip": xip} if xip else {}), **({"blocks": blocks} if blocks else {})},
        "generation": GENERATION_DEFAULTS,
    }
    with one_line_when_full(Path(out).absolute().parent, f"exported model {Path(out).name}",
                            len(model_bin) + len(vocab_bin)), atomic_dir(out) as tmp:
        (tmp / "model.bin").write_bytes(model_bin)
        (tmp / "vocab.bin").write_bytes(vocab_bin)
        atomic_write_json(tmp / "config.json", config)
    return config


def is_export(folder: Path) -> bool:
    """True for a folder this exporter wrote (only model files, config.json with a "format"): --out may replace it."""
    try:
        config = read_json(folder / "config.json")
    except PiconeoxError:
        return False
    return isinstance(config, dict) and "format" in config and {p.name for p in folder.iterdir()} <= set(MODEL_FILES)


def where(runtime: dict) -> str:
    if runtime.get("xip"):
        return "weights read in place from raw flash"
    if runtime.get("blocks"):
        return "weights read in place from model.blk's littlefs blocks"
    return "streaming layers from flash" if runtime["stream"] else "all weights in RAM"


@cli
def main(argv: list[str] | None = None) -> int:
    ap = CliParser(prog="python -m rp2040.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="HF model dir, checkpoints/<run>/step-N/, or checkpoints/<run>/")
    ap.add_argument("--out", type=Path, required=True, help="output dir, e.g. models/<name> "
                    "(new, empty, or an earlier export)")
    ap.add_argument("--dtype", default="int8", help="f32 or int8 (default int8)")
    ap.add_argument("--ram-budget-kb", type=int, default=DEFAULT_RAM_BUDGET_KB,
                    help=f"refuse models whose estimated heap exceeds this (default {DEFAULT_RAM_BUDGET_KB})")
    ap.add_argument("--min-free-kb", type=int, default=DEFAULT_MIN_FREE_KB,
                    help="keep the weights in RAM only if the Pico keeps this much heap free after loading; "
                         f"else stream them from flash (default {DEFAULT_MIN_FREE_KB})")
    ap.add_argument("--force", action="store_true", help="export even when over the RAM budget")
    ap.add_argument("--in-place", action="store_true", help="read the weights in place from raw flash even when "
                    "they fit in RAM (the default only when they do not)")
    args = ap.parse_args(argv)
    cfg = export(args.checkpoint, args.out, args.dtype, args.ram_budget_kb, args.force, args.min_free_kb,
                 args.in_place)
    ram = cfg["ram"]
    for name, size in cfg["files"].items():
        print(f"{args.out / name}: {size:,} bytes")
    print(f"estimated RAM: {ram['estimate_bytes'] / 1024:.1f} KB of {ram['budget_bytes'] // 1024} KB budget "
          f"({where(cfg['runtime'])}; "
          f"in RAM {ram['in_ram_bytes'] / 1024:.1f} KB, streamed {ram['streamed_bytes'] / 1024:.1f} KB); "
          f"heap free after load on a Pico: about {ram['free_after_load_bytes'] / 1024:.1f} KB")
    if ram["estimate_bytes"] > ram["budget_bytes"]:
        print("warning: over the RAM budget (--force)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    exit_process(main())
