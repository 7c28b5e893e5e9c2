"""Turn a sharded (DCP) checkpoint into a from_pretrained folder.

    python -m utils.consolidate checkpoints/<run>/step-00000100 --out models/step-100

writes config.json + model.safetensors + the tokenizer (AutoModelForCausalLM / AutoTokenizer load it) and a
COMPLETE marker with crc32c checksums. Only the model weights are read (never the optimizer state), in one
process, without a process group. The run does this for final/ at its end; best/ is written consolidated.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from utils.ckpt.write import consolidate
from utils.errors import CliParser, PiconeoxError, cli, exit_process


@cli
def main(argv=None) -> int:
    p = CliParser(prog="python -m utils.consolidate", description=__doc__,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="a complete checkpoint folder, e.g. checkpoints/<run>/step-00000100")
    p.add_argument("--out", type=Path, required=True, help="the from_pretrained folder to write (new, empty, or "
                   "an earlier output of this command)")
    p.add_argument("--weights", choices=("model", "ema"), default="model",
                   help="model (the trained weights) or ema (their average, from a run with train.ema_decay)")
    args = p.parse_args(argv)
    if not args.checkpoint.is_dir():
        raise PiconeoxError(f"{args.checkpoint}: no such checkpoint folder")
    try:
        out = consolidate(args.checkpoint, args.out, None if args.weights == "model" else args.weights)
    except OSError as e:
        raise PiconeoxError(f"--out {args.out}: {e.strerror}") from None
    print(f"wrote {out} (load it with AutoModelForCausalLM.from_pretrained)")
    return 0


if __name__ == "__main__":
    exit_process(main())
