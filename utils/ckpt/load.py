"""Reading checkpoints: the small parts of a step folder, this rank's slices of the sharded state, and any
checkpoint's model for inference (in one process, without a process group: only the weights are read).
Loading never runs code from a checkpoint: every pickle in it is read through an allowlist (safe_load)."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from utils.ckpt.ranges import optimizer_problem
from utils.ckpt.format import DCP_INDEX, MARKER, WEIGHTS_FILE, check_complete, foreign_entry, rng_name
from utils.ckpt.state import sharded_state
from utils.errors import PiconeoxError, first_line


def read_part(folder: Path, name: str, like: dict | None = None) -> object | None:
    """The saved state of part `name` (<name>.json; an older checkpoint's <name>.pt through the bounded pickle
    reader), or None when the checkpoint has none. `like`: the part's own state_dict(); the saved state must have
    its keys and kinds of values (a hostile file sets no other attribute, and fails here, not at step 1)."""
    from utils.textfile import read_json
    from utils.ckpt.untrusted.safe_load import load_small_state

    folder = Path(folder)
    path = folder / f"{name}.json"
    if path.is_file():
        state = read_json(path)
    elif (path := folder / f"{name}.pt").is_file():
        try:
            state = load_small_state(path)
        except (MemoryError, OverflowError) as e:  # an array a pickle claims, larger than memory
            raise PiconeoxError(f"{path}: not a {name} state this run can load ({first_line(e, 200)})") from None
    else:
        return None
    if like is not None and (why := unlike(state, like)):
        raise PiconeoxError(f"{path}: not a {name} state this run can load: {why}")
    return state


def kind(value) -> str:
    return ("null" if value is None else "bool" if isinstance(value, bool) else "number"
            if isinstance(value, (int, float)) else type(value).__name__)


def unlike(saved, like, top: bool = True, nullable: bool = False) -> str | None:
    """Why `saved` is not shaped like `like` (the same keys at the top, the same kinds of values, scalar lists of
    the same length), or None. Null stands where the run's own value is null (JSON has no inf: TrainerState saves
    None for it) and may then be a number; never where a number belongs."""
    if top and not isinstance(saved, dict):
        return f"expected a JSON object, found {kind(saved)}"
    if isinstance(like, dict) and isinstance(saved, dict):
        if top and saved.keys() != like.keys():
            odd = sorted(map(str, saved.keys() ^ like.keys()))[:3]
            return f"its keys differ from {sorted(like)} ({', '.join(odd)})"
        return next((f"{key}: {why}" for key in saved.keys() & like.keys()
                     if (why := unlike(saved[key], like[key], top=False, nullable=True))), None)
    if kind(saved) != kind(like) and not (nullable and kind(like) == "null" and kind(saved) == "number"):
        return f"{kind(saved)} where {kind(like)} belongs"
    if isinstance(like, list) and like:
        if kind(like[0]) not in ("list", "dict") and len(saved) != len(like):
            return f"{len(saved)} values where {len(like)} belong"
        return next((f"[{i}]: {why}" for i, v in enumerate(saved) if (why := unlike(v, like[0], top=False))), None)
    return None


def read_rng(folder: Path, rank: int) -> dict:
    """This rank's RNG state (rank 0's when the checkpoint had fewer ranks); rng-*.json, or an older checkpoint's
    rng-*.pt through the bounded pickle reader. Every value is checked before any generator is set."""
    from utils.textfile import read_json
    from utils.ckpt.untrusted.safe_load import load_small_state
    from utils.ckpt.state import rng_from_json, rng_to_json

    folder = Path(folder)
    path = next((p for r in (rank, 0) for s in ("json", "pt") if (p := folder / rng_name(r, s)).is_file()), None)
    if path is None:
        raise PiconeoxError(f"{folder}: the checkpoint has no RNG state ({rng_name(0)}); it cannot be resumed exactly")
    try:
        return rng_from_json(read_json(path) if path.suffix == ".json" else rng_to_json(load_small_state(path)))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError, MemoryError,
            OverflowError) as e:  # MemoryError: a pickled array of 10^12 elements
        raise PiconeoxError(f"{path}: not an RNG state piconeox wrote ({first_line(e, 200)})") from None


def load_sharded(folder: Path, model, optimizer) -> None:
    """Load model and optimizer state in place; every rank reads only the slices of its own shards (DCP
    reshards when the world size or sharding differ). Every rank must call this."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from utils.ckpt.untrusted.safe_load import load_dcp

    state = sharded_state(model, optimizer)  # this rank's tensors: DCP fills them in place
    try:
        load_dcp(state, folder, no_dist=not dist.is_initialized())
    except PiconeoxError:  # a refusal or an unreadable index: already one line naming the file
        raise
    except Exception as e:  # CheckpointException wraps every rank's error; one line is enough for the user
        raise PiconeoxError(f"{folder}: cannot load the sharded state: {first_line(e, 300)}") from e
    if why := optimizer_problem(state["optim"]):
        raise PiconeoxError(f"{folder}: not an optimizer state a run writes: {why}")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def checked(folder: Path) -> Path:
    """`folder` when it is a complete checkpoint whose files all match their crc32c; else one-line error."""
    reason = check_complete(folder, verify=True)
    if reason:
        raise PiconeoxError(reason)
    return Path(folder)


def weights_problem(found: dict, like: dict) -> str | None:
    """Why `found` ({name: (shape, dtype)}, e.g. a DCP index's weights) are not the weights of `like`
    (model_skeleton's): the same names, shapes and dtypes. None when they are."""
    if odd := sorted(found.keys() ^ like.keys()):
        return f"{odd[0][:100]} is {'not a weight of the model' if odd[0] in found else 'missing'}"

    def name(spec):
        return f"a {str(spec[1]).removeprefix('torch.')} tensor of shape {list(spec[0])}"

    return next((f"{key[:100]}: {name(found[key])} where {name(like[key])} belongs" for key in sorted(like)
                 if (tuple(found[key][0]), found[key][1]) != like[key]), None)


def read_weights(folder: Path, part: str = "model") -> dict[str, torch.Tensor]:
    """The full model weights of a DCP checkpoint folder (any number of shards), on the CPU; `part`: a sharded
    part holding weights instead (utils/ckpt/parts.py), e.g. "ema"."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from utils.ckpt.hf.hf_folder import checked_config, model_skeleton
    from utils.ckpt.untrusted.safe_load import SafeFileSystemReader, load_dcp

    meta = SafeFileSystemReader(str(folder)).read_metadata().state_dict_metadata

    def weights(name: str) -> dict:
        return {key[len(name) + 1:]: m for key, m in meta.items()
                if key.startswith(f"{name}.") and isinstance(m, TensorStorageMetadata)}

    entries = weights(part)
    if not entries:
        raise PiconeoxError(f"{folder}: the checkpoint holds no {part} weights")
    claimed = sum(math.prod(m.size) * m.properties.dtype.itemsize for m in entries.values())  # exact: no wrap
    held = sum(p.stat().st_size for p in Path(folder).glob("*.distcp"))
    if claimed > held:  # the index alone must not make us allocate: its sizes must be in the files
        raise PiconeoxError(f"{folder}/{DCP_INDEX}: its {part} weights hold {claimed:,} bytes, but the folder's "
                            f".distcp files only {held:,}")
    if part != "model":  # the part's weights stand in for the model's: the same names, shapes and dtypes
        model = {key: (tuple(m.size), m.properties.dtype) for key, m in weights("model").items()}
        if odd := next((k for k in sorted(model.keys() | entries.keys()) if model.get(k) !=
                        ((tuple(entries[k].size), entries[k].properties.dtype) if k in entries else None)), None):
            held = (list(entries[odd].size), entries[odd].properties.dtype) if odd in entries else "nothing"
            raise PiconeoxError(f"{folder}/{DCP_INDEX}: its {part} weights hold {held} for {odd[:100]!r}, the model "
                                f"{list(model[odd]) if odd in model else 'nothing'}")
    found = {key: (tuple(m.size), m.properties.dtype) for key, m in entries.items()}
    if why := weights_problem(found, model_skeleton(checked_config(folder))):  # what a run writes there
        raise PiconeoxError(f"{folder}/{DCP_INDEX}: its {part} weights are not the model's: {why}")
    state = {part: {key: torch.empty(m.size, dtype=m.properties.dtype) for key, m in entries.items()}}
    load_dcp(state, folder, no_dist=True)
    return state[part]


def load_model(folder: Path):
    """A GPTNeoXForCausalLM (float32, eval-ready) from best/, final/, a step folder or a from_pretrained folder.

    Folders with a COMPLETE marker are verified first (sizes and crc32c), so corruption is one clear line.
    """
    from safetensors import SafetensorError
    from transformers import GPTNeoXForCausalLM

    from utils.ckpt.hf.hf_folder import checked_config

    folder = Path(folder)
    if (folder / MARKER).exists():
        checked(folder)
    elif reason := foreign_entry(folder):
        raise PiconeoxError(reason)
    try:
        config = checked_config(folder)  # GPT-NeoX, no code, sizes those of the weights: before anything is built
        if (folder / WEIGHTS_FILE).is_file():
            return GPTNeoXForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32,
                                                      attn_implementation="sdpa")
        if not (folder / DCP_INDEX).is_file():
            raise PiconeoxError(f"{folder} holds no model: expected model.safetensors or a sharded checkpoint")
        with torch.device("meta"):
            model = GPTNeoXForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
        model.load_state_dict(read_weights(folder), assign=True)
        model.tie_weights()
        # RoPE's inv_freq is a non-persistent buffer, in no checkpoint: compute it for real, not on meta
        model.gpt_neox.rotary_emb = type(model.gpt_neox.rotary_emb)(config=model.config)
        return model.eval()
    except (SafetensorError, OSError, RuntimeError, ValueError, MemoryError) as e:
        raise PiconeoxError(f"{folder}: cannot load the model: {first_line(e, 300)}") from e
