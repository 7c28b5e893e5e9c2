"""Reading checkpoints: the small parts of a step folder, this rank's slices of the sharded state, and any
checkpoint's model for inference (in one process, without a process group: only the weights are read).
Loading never runs code from a checkpoint: every pickle in it is read through an allowlist (safe_load)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from utils.ckpt.format import DCP_INDEX, MARKER, WEIGHTS_FILE, check_complete, foreign_entry, rng_name
from utils.ckpt.state import sharded_state
from utils.errors import PiconeoxError


def read_part(folder: Path, name: str) -> object | None:
    """The saved state of part `name` (<name>.json or <name>.pt), or None when the checkpoint has none."""
    from utils.ckpt.safe_load import load_small_state

    folder = Path(folder)
    if (folder / f"{name}.json").is_file():
        return json.loads((folder / f"{name}.json").read_text())
    path = folder / f"{name}.pt"
    return load_small_state(path) if path.is_file() else None


def read_rng(folder: Path, rank: int) -> dict:
    """This rank's RNG state (rank 0's when the checkpoint had fewer ranks)."""
    from utils.ckpt.safe_load import load_small_state

    rng = Path(folder) / rng_name(rank)
    return load_small_state(rng if rng.exists() else Path(folder) / rng_name(0))


def load_sharded(folder: Path, model, optimizer) -> None:
    """Load model and optimizer state in place; every rank reads only the slices of its own shards (DCP
    reshards when the world size or sharding differ). Every rank must call this."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from utils.ckpt.safe_load import load_dcp

    state = sharded_state(model, optimizer)  # this rank's tensors: DCP fills them in place
    try:
        load_dcp(state, folder, no_dist=not dist.is_initialized())
    except PiconeoxError:  # a refusal or an unreadable index: already one line naming the file
        raise
    except Exception as e:  # CheckpointException wraps every rank's error; one line is enough for the user
        raise PiconeoxError(f"{folder}: cannot load the sharded state: {str(e).splitlines()[0][:300]}") from e
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def checked(folder: Path) -> Path:
    """`folder` when it is a complete checkpoint whose files all match their crc32c; else one-line error."""
    reason = check_complete(folder, verify=True)
    if reason:
        raise PiconeoxError(reason)
    return Path(folder)


def read_weights(folder: Path, part: str = "model") -> dict[str, torch.Tensor]:
    """The full model weights of a DCP checkpoint folder (any number of shards), on the CPU; `part`: a sharded
    part holding weights instead (utils/ckpt/parts.py), e.g. "ema"."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from utils.ckpt.safe_load import SafeFileSystemReader, load_dcp

    meta = SafeFileSystemReader(str(folder)).read_metadata().state_dict_metadata
    prefix = f"{part}."
    weights = {key[len(prefix):]: torch.empty(m.size, dtype=m.properties.dtype)
               for key, m in meta.items() if key.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
    if not weights:
        raise PiconeoxError(f"{folder}: the checkpoint holds no {part} weights")
    state = {part: weights}
    load_dcp(state, folder, no_dist=True)
    return state[part]


def load_model(folder: Path):
    """A GPTNeoXForCausalLM (float32, eval-ready) from best/, final/, a step folder or a from_pretrained folder.

    Folders with a COMPLETE marker are verified first (sizes and crc32c), so corruption is one clear line.
    """
    from safetensors import SafetensorError
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    folder = Path(folder)
    if (folder / MARKER).exists():
        checked(folder)
    elif reason := foreign_entry(folder):
        raise PiconeoxError(reason)
    try:
        if (folder / WEIGHTS_FILE).is_file():
            return GPTNeoXForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
        if not (folder / DCP_INDEX).is_file():
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
