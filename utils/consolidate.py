"""Turn a sharded (DCP) checkpoint into a from_pretrained folder, and load any checkpoint's model for inference.

    python -m utils.consolidate checkpoints/<run>/step-00000100 --out models/step-100

writes config.json + model.safetensors + the tokenizer (AutoModelForCausalLM / AutoTokenizer load it) and a
COMPLETE marker with crc32c checksums. Only the model weights are read (never the optimizer state), in one
process, without a process group. The run calls this for final/ at its end; best/ is written consolidated.
"""
from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from pathlib import Path
from typing import Iterator

import torch

from utils import checkpoint as ckpt
from utils.errors import CliParser, PiconeoxError
from utils.outputs import atomic_dir, check_output_dir
from utils.portable import make_portable

MODEL_PREFIX = "model."


def checked(folder: Path) -> Path:
    """`folder` when it is a complete checkpoint whose files all match their crc32c; else one-line error."""
    reason = ckpt.check_complete(folder, verify=True)
    if reason:
        raise PiconeoxError(reason)
    return Path(folder)


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The full model weights of a DCP checkpoint folder (any number of shards), on the CPU."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(folder))
    meta = reader.read_metadata().state_dict_metadata
    weights = {key[len(MODEL_PREFIX):]: torch.empty(m.size, dtype=m.properties.dtype)
               for key, m in meta.items() if key.startswith(MODEL_PREFIX) and isinstance(m, TensorStorageMetadata)}
    if not weights:
        raise PiconeoxError(f"{folder}: the checkpoint holds no model weights")
    state = {"model": weights}
    dcp.load(state, storage_reader=reader, no_dist=True)
    return state["model"]


def load_model(folder: Path):
    """A GPTNeoXForCausalLM (float32, eval-ready) from best/, final/, a step folder or a from_pretrained folder.

    Folders with a COMPLETE marker are verified first (sizes and crc32c), so corruption is one clear line.
    """
    from safetensors import SafetensorError
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    folder = Path(folder)
    if (folder / ckpt.MARKER).exists():
        checked(folder)
    try:
        if (folder / "model.safetensors").is_file():
            return GPTNeoXForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
        if not (folder / ckpt.DCP_INDEX).is_file():
            raise PiconeoxError(f"{folder} holds no model: expected model.safetensors or a sharded checkpoint")
        config = GPTNeoXConfig.from_pretrained(folder)
        with torch.device("meta"):
            model = GPTNeoXForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
        model.load_state_dict(read_weights(folder), assign=True)
        model.tie_weights()
        # RoPE's inv_freq is a non-persistent buffer, in no checkpoint: compute it for real, not on meta
        model.gpt_neox.rotary_emb = type(model.gpt_neox.rotary_emb)(config=model.config)
        return model.eval()
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise PiconeoxError(f"{folder}: cannot load the model: {str(e).splitlines()[0][:300]}") from e


@contextlib.contextmanager
def consolidate_into(folder: Path) -> Iterator[Path]:
    """A temporary folder (next to `folder`, removed afterwards) holding config.json + model.safetensors."""
    from transformers import GPTNeoXConfig

    tmp = Path(folder).with_name(f".{Path(folder).name}.weights.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        ckpt.save_pretrained_weights(GPTNeoXConfig.from_pretrained(folder), read_weights(folder), tmp)
        make_portable(tmp, tokenizer_dir=folder)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_consolidated(folder: Path) -> bool:
    """True for a from_pretrained folder with its marker, as consolidate() writes (what --out may replace)."""
    return (folder / ckpt.MARKER).is_file() and (folder / "model.safetensors").is_file() and \
        not any(p.is_dir() for p in folder.iterdir())


def consolidate(folder: Path, out: Path) -> Path:
    """Write `folder`'s weights as a from_pretrained folder `out` (atomically, marker last)."""
    folder, out = Path(folder), Path(out)
    if out.resolve() == folder.resolve():
        raise PiconeoxError(f"--out {out}: must differ from the checkpoint folder")
    check_output_dir(out, "--out", is_consolidated, "a consolidated checkpoint")
    checked(folder)
    with atomic_dir(out) as tmp, consolidate_into(folder) as weights:
        for path in weights.iterdir():
            shutil.move(path, tmp / path.name)
        for path in folder.iterdir():  # the tokenizer and the small json states travel along
            if path.is_file() and (path.name.startswith(("tokenizer", "special_tokens")) or
                                   path.name in {f"{n}.json" for n in ckpt.JSON_PARTS}):
                shutil.copy2(path, tmp / path.name)
        make_portable(tmp)  # also fixes the tokenizer files of a checkpoint written before utils.portable
        marker = ckpt.read_marker(folder)
        ckpt.write_marker(tmp, marker["step"], marker.get("world_size", 1),
                          ckpt.manifest(tmp, [p.name for p in tmp.iterdir() if p.is_file()]))
    return out


def main(argv=None) -> int:
    p = CliParser(
        prog="python -m utils.consolidate", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="a complete checkpoint folder, e.g. checkpoints/<run>/step-00000100")
    p.add_argument("--out", type=Path, required=True, help="the from_pretrained folder to write (new, empty, or "
                   "an earlier output of this command)")
    args = p.parse_args(argv)
    try:
        if not args.checkpoint.is_dir():
            raise PiconeoxError(f"{args.checkpoint}: no such checkpoint folder")
        out = consolidate(args.checkpoint, args.out)
    except PiconeoxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: --out {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"wrote {out} (load it with AutoModelForCausalLM.from_pretrained)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
