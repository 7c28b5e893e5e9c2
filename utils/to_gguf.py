"""Export a checkpoint as GGUF for llama.cpp, ollama and LM Studio (see utils/interop/gguf_export.py).

    python -m utils.to_gguf checkpoints/<run>/best --out model.gguf [--type f32|f16|q8_0]
    llama-simple -m model.gguf -n 32 "Once upon a time"
"""
from __future__ import annotations

import argparse
from pathlib import Path

from utils.errors import CliParser, PiconeoxError, cli, exit_process


GGUF_MAGIC = b"GGUF"


def check_not_overwriting(out: Path, checkpoint: Path) -> None:
    """--out replaces only an earlier GGUF, and never writes inside a checkpoint (its files are its manifest's)."""
    from utils.ckpt.read import MARKER

    folder = out.absolute().parent
    inside = folder.resolve().is_relative_to(checkpoint.resolve()) if checkpoint.exists() else False
    if inside or any((folder / name).exists() for name in (MARKER, "config.json")):
        raise PiconeoxError(f"--out {out}: {folder} is a checkpoint folder; write the GGUF outside it, "
                            f"e.g. --out {out.name}")
    if out.is_file():
        with open(out, "rb") as f:
            if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                raise PiconeoxError(f"--out {out} exists and is not a GGUF file; it is not replaced: choose another "
                                    "name")


@cli
def main(argv=None) -> int:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint folder: checkpoints/<run>/best, final or step-XXXXXXXX, or a run")
    p.add_argument("--out", type=Path, required=True, help="the .gguf file to write (replaced atomically)")
    p.add_argument("--type", default="f16", help="tensor type of the matrices: f32, f16 or q8_0 (default f16)")
    args = p.parse_args(argv)
    from utils.ckpt.read import open_checkpoint
    from utils.interop.gguf_export import OUT_TYPES, export_gguf
    from utils.atomic import check_output_file
    from utils.diskfull import one_line_when_full

    if args.type not in OUT_TYPES:
        raise PiconeoxError(f"--type {args.type!r} is not one of {', '.join(OUT_TYPES)}")
    check_output_file(args.out, "--out")
    check_not_overwriting(args.out, Path(args.checkpoint))
    model, tokenizer = open_checkpoint(args.checkpoint)
    ckpt = Path(args.checkpoint).resolve()
    name = ckpt.parent.name if ckpt.name in ("best", "final") else ckpt.name  # the run's name
    with one_line_when_full(args.out.absolute().parent, f"GGUF file {args.out.name}"):
        counts = export_gguf(model, tokenizer.backend_tokenizer, args.out, args.type, name=name)
    print(f"wrote {args.out} ({', '.join(f'{n} {t}' for t, n in counts.items())} tensors)")
    return 0


if __name__ == "__main__":
    exit_process(main())
