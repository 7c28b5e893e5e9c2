"""Val loss of a trained character-level model, scored as nanoGPT's estimate_loss does, for shakespeare_char.sh.

    char_val_loss.py piconeox CHECKPOINT DATA_DIR     (a piconeox final/ checkpoint and its prepared data)
    char_val_loss.py nanogpt OUT_DIR CHECKOUT         (a nanoGPT ckpt.pt, read with that checkout's model.py)

Prints two numbers: the mean loss over 200 batches of 12 random 64-token windows of val from a fixed seed (so
both models see the same blocks) and the loss over all of val in consecutive blocks.
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F

kind, ckpt, data = sys.argv[1:4]
if kind == "piconeox":
    from utils.generate import load_checkpoint_model
    from utils.data.shards import open_shard, read_manifest

    model, _ = load_checkpoint_model(ckpt)
    m = read_manifest(data)
    # = nanoGPT's val.bin (no end-of-text)
    val = np.concatenate([open_shard(data, s) for s in m.split_shards("val")])[:-1]
    def logits(x):
        return model(input_ids=x).logits
else:  # a nanoGPT checkout's ckpt.pt, read with its own model.py
    sys.path.insert(0, data)
    from model import GPT, GPTConfig

    saved = torch.load(f"{ckpt}/ckpt.pt", map_location="cpu")
    model = GPT(GPTConfig(**saved["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in saved["model"].items()})
    val = np.fromfile(f"{data}/data/shakespeare_char/val.bin", dtype=np.uint16)
    def logits(x):  # with targets it returns logits for every position
        return model(x, x)[0]
model.eval()
val = torch.from_numpy(val.astype(np.int64))
block, batch = 64, 12


@torch.no_grad()
def loss(starts) -> float:
    x = torch.stack([val[i: i + block] for i in starts])
    y = torch.stack([val[i + 1: i + 1 + block] for i in starts])
    out = logits(x)
    return F.cross_entropy(out.reshape(-1, out.size(-1)), y.view(-1)).item()


gen = torch.Generator().manual_seed(1337)
random = np.mean([loss(torch.randint(len(val) - block, (batch,), generator=gen).tolist()) for _ in range(200)])
starts = list(range(0, len(val) - block - 1, block))
full = np.mean([loss(starts[i: i + 256]) for i in range(0, len(starts), 256)])
print(f"{random:.4f} {full:.4f}")
