"""What a DCP index (`.metadata`) must say before anything is read or allocated from it: only what our writer
puts there (tensors with a dtype and a shape whose chunks tile it exactly, and values), pointing only into regular
files of its folder that its COMPLETE marker lists, every slice inside its file."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from utils.ckpt.untrusted.refusal import UnsafeCheckpoint
from utils.errors import PiconeoxError


def index_problem(metadata) -> str | None:
    """What in a DCP index our writer never puts there, or None: entries other than tensors (with a dtype, a
    shape and chunks that tile it) and values; storage records that need a transform (DCP's extensions decompress)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict) or not isinstance(metadata.storage_data, dict):
        return "its entries or storage records are not dictionaries"
    for key, m in entries.items():
        if isinstance(m, BytesStorageMetadata) and isinstance(key, str):
            continue
        if not (isinstance(key, str) and isinstance(m, TensorStorageMetadata) and shape(m.size)
                and isinstance(getattr(m.properties, "dtype", None), torch.dtype) and isinstance(m.chunks, list)
                and all(shape(c.offsets) and shape(c.sizes) and len(c.offsets) == len(c.sizes) == len(m.size) and
                        all(o + n <= d for o, n, d in zip(c.offsets, c.sizes, m.size)) for c in m.chunks)):
            return f"entry {str(key)[:100]!r} is not a tensor with a dtype, a shape and chunks inside it"
        if why := tiling_problem(m.size, m.chunks):
            return f"entry {str(key)[:100]!r} of shape {list(m.size)}: {why}"
    if any(getattr(info, "transform_descriptors", None) for info in metadata.storage_data.values()):
        return "a storage record needs a transform (compression); piconeox writes none"
    return None


def shape(value) -> bool:
    return isinstance(value, torch.Size) and all(type(n) is int and n >= 0 for n in value)


def tiling_problem(size: torch.Size, chunks: list) -> str | None:
    """Why `chunks` (inside `size`) do not cover a tensor of `size` exactly, or None. DCP writes one chunk per
    rank holding a slab: whole along every dimension but one (FSDP2 and HSDP shard dimension 0), the slabs one
    after the other along it. An element no chunk covers would be loaded as whatever memory held before."""
    if math.prod(size) == 0:  # exact: torch's numel() wraps around past 2**63
        return None
    pieces = [c for c in chunks if math.prod(c.sizes)]  # an empty shard (uneven sharding) holds nothing
    cut = [d for d in range(len(size)) if any(c.sizes[d] != size[d] for c in pieces)]
    if len(cut) > 1:
        return f"its chunks are cut along dimensions {cut}; piconeox writes slabs along one"
    along = cut[0] if cut else 0
    end = 0
    for c in sorted(pieces, key=lambda c: c.offsets[along] if cut else 0):
        start = c.offsets[along] if cut else 0
        if start != end:
            return (f"its chunks {'overlap' if start < end else 'leave a gap'} at {end:,} along dimension {along} "
                    "(they must cover it exactly)")
        end = start + (c.sizes[along] if cut else size[along] if size else 1)
    if end != (size[along] if size else 1):
        return f"its chunks cover {end:,} of {size[along] if size else 1:,} along dimension {along}"
    return None


def check_storage(folder: Path, metadata, path) -> None:
    """Every file the index `path` points into is a plain name of a regular file in `folder`, listed in the folder's
    COMPLETE marker (when it has one), and every slice lies within that file: a load reads nothing else."""
    from utils.ckpt.format import read_marker, regular_file

    marker = read_marker(folder)
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        name, offset, length = (getattr(info, key, None) for key in ("relative_path", "offset", "length"))
        try:
            file = regular_file(folder, name)
        except PiconeoxError as e:
            raise UnsafeCheckpoint(f"{path}: refused to load: it points at {name!r} ({e})") from None
        if marker is not None and name not in marker["files"]:
            raise UnsafeCheckpoint(f"{path}: refused to load: it points at {name}, which its {folder / 'COMPLETE'} "
                                   "marker does not list (every file a load reads is listed there)")
        if name not in sizes:
            sizes[name] = file.stat().st_size if file.is_file() else -1
        if not (type(offset) is type(length) is int and 0 <= offset and 0 <= length
                and offset + length <= sizes[name]):
            raise PiconeoxError(f"{path}: not a readable checkpoint index: it reads {shown(length)} bytes at "
                                f"{shown(offset)} of {name}, which has {max(sizes[name], 0)} bytes")


def shown(value) -> str:
    """`value` for an error line: an integer too long to print (Python refuses 4,300+ digits) by its size."""
    return f"an integer of {value.bit_length():,} bits" if type(value) is int and value.bit_length() > 64 else \
        repr(value)[:100]
