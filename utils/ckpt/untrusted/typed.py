"""What a value loaded from a checkpoint must be: the type (for a tensor its dtype and shape) of the value the run
itself holds at that place, checked before the load hands it on.

The bounded reader (`bounded`, `pickle_walk`) makes a record cheap to read and the allowlist (`safe_load`) makes it
harmless to build; neither says what it is. A record of `.distcp` may hold any allowed value: a tuple where the
optimizer's learning rate belongs reached torch's fused AdamW (a TypeError at the first step), a tuple where a
weight belongs reached DCP's narrowing (an AttributeError). The load compares each value with the skeleton the run
builds itself (its model's and optimizer's own state dicts; utils/ckpt/load.py compares a checkpoint's weights with
a model built on the meta device from its config): what differs is one line naming the file and the key.
"""
from __future__ import annotations

import math

import torch


def kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return "null" if value is None else f"a {type(value).__name__}"


def tensor_problem(saved, dtype: torch.dtype, shape) -> str | None:
    """Why `saved` is not a tensor of `dtype` and `shape`, or None."""
    if not isinstance(saved, torch.Tensor) or saved.dtype != dtype or tuple(saved.shape) != tuple(shape):
        return f"holds {kind(saved)} where a {str(dtype).removeprefix('torch.')} tensor of shape {list(shape)} belongs"
    return None


def value_problem(saved, like, key: str = "") -> str | None:
    """Why `saved` is not a value of the kind `like` is (the run's own value at that place), or None: a tensor of
    the same dtype and shape; a finite number where a number is (a learning rate within the scheduler's range);
    a flag (true, false or null) where a flag or null is; a string; a tuple or list of as many values, each like
    its own; a dict with the same keys."""
    if isinstance(like, torch.Tensor):
        return tensor_problem(saved, like.dtype, like.shape)
    if like is None or isinstance(like, bool):
        return None if saved is None or type(saved) is bool else f"holds {kind(saved)} where a flag belongs"
    if isinstance(like, (int, float)):
        if type(saved) not in (int, float):
            return f"holds {kind(saved)} where a number belongs"
        return None if math.isfinite(saved) else f"holds {saved!r} where a finite number belongs"
    if isinstance(like, str):
        return None if type(saved) is str else f"holds {kind(saved)} where a string belongs"
    if isinstance(like, (tuple, list)):
        if key.rsplit(".", 1)[-1] == "params" and saved != like:  # which parameters a group holds: the model's
            return f"lists the parameters {str(saved)[:80]} where the model's {str(like)[:80]} belong"
        if type(saved) not in (tuple, list) or len(saved) != len(like):
            return f"holds {kind(saved)}{f' of {len(saved)}' if isinstance(saved, (tuple, list)) else ''} where " \
                   f"a {type(like).__name__} of {len(like)} belongs"
        return next((f"[{i}] {why}" for i, (s, v) in enumerate(zip(saved, like)) if (why := value_problem(s, v))),
                    None)
    if isinstance(like, dict):
        if type(saved) is not dict or saved.keys() != like.keys():
            return f"holds {kind(saved)} where a dict with the keys {sorted(map(str, like))[:5]} belongs"
        return next((f"[{k!r}] {why}" for k in like if (why := value_problem(saved[k], like[k]))), None)
    return None if type(saved) is type(like) else f"holds {kind(saved)} where {kind(like)} belongs"


def index_problem(state: dict, entries: dict) -> str | None:
    """Why a DCP index's `entries` ({key: its storage metadata}) do not hold `state`'s values (flattened: the keys
    the load asks for) as the run writes them: a tensor where a tensor is, of the same dtype (DCP checks the
    shape), a pickled value where a value is. None when they do; a key the index lacks is DCP's to refuse."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    for key, value in state.items():
        entry = entries.get(key)
        if entry is None:
            continue
        if isinstance(value, torch.Tensor):
            if not isinstance(entry, TensorStorageMetadata):
                return f"{key} is listed as a pickled value where {kind(value)} belongs"
            if entry.properties.dtype != value.dtype:
                return f"{key} is listed as a {str(entry.properties.dtype).removeprefix('torch.')} tensor where " \
                       f"{kind(value)} belongs"
        elif not isinstance(entry, BytesStorageMetadata):
            return f"{key} is listed as a tensor where {kind(value)} belongs"
    return None


def record_problem(record, metadata, index) -> str | None:
    """Why a tensor record of `.distcp` is not the chunk the index lists for it (`index`: its MetadataIndex): a
    tensor of the entry's dtype and the chunk's shape. None when it is."""
    entry = metadata.state_dict_metadata.get(index.fqn)
    chunk = next((c for c in getattr(entry, "chunks", ()) if index.offset is not None and
                  tuple(c.offsets) == tuple(index.offset)), None)
    if chunk is None:
        return "is not a chunk the index lists"
    return tensor_problem(record, entry.properties.dtype, chunk.sizes)
