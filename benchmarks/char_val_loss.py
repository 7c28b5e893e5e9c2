"""Val loss of a trained character-level model, scored as nanoGPT's estimate_loss does, for shakespeare_char.sh.

    char_val_loss.py piconeox CHECKPOINT DATA_DIR     (a piconeox final/ checkpoint and its prepared data)
    char_val_loss.py nanogpt OUT_DIR CHECKOUT         (a nanoGPT ckpt.pt, read with that checkout's model.py)

Prints two numbers: the mean loss over 200 batches of 12 random 64-token windows of val from a fixed seed (so
both models see the same blocks) and the loss over all of val in consecutive blocks.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.errors import CliParser, PiconeoxError, cli  # noqa: E402

BLOCK, BATCH = 64, 12


def piconeox_model(ckpt: str, data: str):
    """(logits function, val tokens) of a piconeox checkpoint and its prepared data (= nanoGPT's val.bin)."""
    import numpy as np

    from utils.data.shards import open_shard, read_manifest
    from utils.ckpt.read import open_checkpoint

    model, _ = open_checkpoint(ckpt)
    m = read_manifest(data)
    val = np.concatenate([open_shard(data, s) for s in m.split_shards("val")])[:-1]  # no end-of-text
    return model.eval(), lambda x: model(input_ids=x).logits, val


def nanogpt_model(ckpt: str, checkout: str):
    """(logits function, val tokens) of a nanoGPT ckpt.pt, read with that checkout's own model.py."""
    import numpy as np
    import torch

    for path in (Path(ckpt) / "ckpt.pt", Path(checkout) / "model.py"):
        if not path.is_file():
            raise PiconeoxError(f"{path}: no such file (nanogpt OUT_DIR CHECKOUT: its ckpt.pt and model.py)")
    sys.path.insert(0, checkout)
    from model import GPT, GPTConfig

    saved = torch.load(f"{ckpt}/ckpt.pt", map_location="cpu")
    model = GPT(GPTConfig(**saved["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in saved["model"].items()})
    val = np.fromfile(f"{checkout}/data/shakespeare_char/val.bin", dtype=np.uint16)
    return model.eval(), lambda x: model(x, x)[0], val  # with targets it returns logits for every position


@cli
def main(argv=None) -> int:
    p = CliParser(prog="char_val_loss.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=("piconeox", "nanogpt"), help="whose checkpoint")
    p.add_argument("checkpoint", help="piconeox: a checkpoint folder; nanogpt: its out_dir (ckpt.pt)")
    p.add_argument("data", help="piconeox: the prepared data folder; nanogpt: the nanoGPT checkout")
    args = p.parse_args(argv)
    import numpy as np
    import torch
    import torch.nn.functional as F

    load = piconeox_model if args.kind == "piconeox" else nanogpt_model
    _, logits, val = load(args.checkpoint, args.data)
    val = torch.from_numpy(val.astype(np.int64))

    @torch.no_grad()
    def loss(starts) -> float:
        x = torch.stack([val[i: i + BLOCK] for i in starts])
        y = torch.stack([val[i + 1: i + 1 + BLOCK] for i in starts])
        out = logits(x)
        return F.cross_entropy(out.reshape(-1, out.size(-1)), y.view(-1)).item()

    gen = torch.Generator().manual_seed(1337)
    random = np.mean([loss(torch.randint(len(val) - BLOCK, (BATCH,), generator=gen).tolist()) for _ in range(200)])
    starts = list(range(0, len(val) - BLOCK - 1, BLOCK))
    full = np.mean([loss(starts[i: i + 256]) for i in range(0, len(starts), 256)])
    print(f"{random:.4f} {full:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
