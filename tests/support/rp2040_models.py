"""Checkpoints of the rp2040 presets for the RP2040 tests: random weights at a wide init (0.5 instead of
training's 0.02, norms untouched) so logits are spread like a trained model's rather than near-ties,
saved with the byte tokenizer exactly as training saves a checkpoint."""
from pathlib import Path

import torch

from configs.model import MODEL_PRESETS, build_model
from utils.data.tokenizers import build_tokenizer, save_tokenizer


def wide_init(model, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.eval()


def save_checkpoint(preset: str, out: Path, seed: int = 0):
    """(checkpoint dir, torch model) of `preset` at the wide init."""
    model = wide_init(build_model(MODEL_PRESETS[preset]), seed)
    model.save_pretrained(out)
    save_tokenizer(build_tokenizer("byte", [], None), out / "tokenizer.json")
    return out, model


def uf2_block(family: int) -> bytes:
    """One UF2 block (family id flag set) of zeros at the start of the RP2040's flash."""
    import struct

    from rp2040 import uf2

    head = struct.pack("<8I", uf2.MAGIC_START0, uf2.MAGIC_START1, uf2.FLAG_FAMILY_ID, 0x10000000, 256, 0, 1, family)
    return head + bytes(476) + struct.pack("<I", uf2.MAGIC_END)


def exported_pico(root: Path) -> tuple[Path, Path]:
    """(checkpoint, exported int8 model) of the rp2040-speed preset under `root`: what the rp2040 CLIs take."""
    from rp2040.export import export

    ckpt = save_checkpoint("rp2040-speed", root / "ckpt")[0]
    export(ckpt, root / "model", "int8")
    return ckpt, root / "model"
