"""Capturing a checkpoint (on the training thread): this rank's state copied off the device, and its RNG.

Saving is split in two so the slow part runs off the training thread: `Registry.capture()` (parts.py) copies this
rank's shard off the device (the only blocking part); utils/ckpt/write.py puts it on disk (on the saver thread).
DCP reshards on load: a checkpoint of N ranks resumes on M ranks, under DDP or FSDP alike.
"""
from __future__ import annotations

import random
import warnings
import weakref
from dataclasses import dataclass

import numpy as np
import torch

# A single process saves and loads without a process group on purpose: DCP's warning about it is noise.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def rng_state() -> dict:
    """This process's RNG: Python, NumPy, torch CPU and only the GPU this rank uses (a box with fewer GPUs
    must still resume: one state per visible GPU would not fit there). The GPU's only when this process runs on
    CUDA already (a GPU run has its model there): a CPU run on a GPU box must not open a CUDA context."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device
    return state


def rng_to_json(state: dict) -> dict:
    """`state` (rng_state()'s, or an older checkpoint's rng-*.pt) as plain JSON values: ints, floats, hex strings."""
    version, internal, gauss = state["python"]
    name, keys, pos, has_gauss, cached = state["numpy"]
    out = {"python": [version, list(internal), gauss],
           "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
           "torch": torch.as_tensor(state["torch"], dtype=torch.uint8).numpy().tobytes().hex()}
    if "cuda" in state:
        out["cuda"] = torch.as_tensor(state["cuda"], dtype=torch.uint8).numpy().tobytes().hex()
    return out


def rng_from_json(saved: dict) -> dict:
    """The state rng_to_json wrote, checked value by value (a ValueError says what is wrong): a hostile file
    sets no generator to a state it could not have had, and fails here rather than mid-run."""
    def words(values, n, what):
        if not (isinstance(values, list) and len(values) == n and
                all(type(v) is int and 0 <= v < 2**32 for v in values)):
            raise ValueError(f"{what} must be {n} integers from 0 to 2**32 - 1")
        return values

    def raw(text, n, what):
        if not isinstance(text, str) or len(text) > 2 * n or len(bytes.fromhex(text)) != n:
            raise ValueError(f"{what} must be {n} bytes in hex")
        return torch.frombuffer(bytearray.fromhex(text), dtype=torch.uint8)

    if not isinstance(saved, dict) or not {"python", "numpy", "torch"} <= saved.keys():
        raise ValueError("expected a JSON object with python, numpy and torch states")
    version, internal, gauss = saved["python"]
    words(internal[:-1], 624, "python's state")
    if version != 3 or type(internal[-1]) is not int or not 0 <= internal[-1] <= 624 or \
            not (gauss is None or type(gauss) is float):
        raise ValueError("python's state must be [3, 625 integers, a float or null]")
    name, keys, pos, has_gauss, cached = saved["numpy"]
    if name != "MT19937" or type(pos) is not int or not 0 <= pos <= 624 or has_gauss not in (0, 1) or \
            type(cached) not in (int, float):
        raise ValueError("numpy's state must be [MT19937, 624 integers, position 0..624, 0 or 1, a float]")
    state = {"python": (3, tuple(internal), gauss),
             "numpy": (name, np.array(words(keys, 624, "numpy's keys"), dtype=np.uint32), pos, has_gauss, cached),
             "torch": raw(saved["torch"], torch.get_rng_state().numel(), "torch's state")}
    if "cuda" in saved and torch.cuda.is_available():
        state["cuda"] = raw(saved["cuda"], torch.cuda.get_rng_state().numel(), "cuda's state")
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"])  # onto the current device, whatever its index was when saved


@dataclass
class Snapshot:
    """One rank's part of a checkpoint, already on the CPU.

    state: {"model": ..., "optim": ...} with this rank's shards (DTensor shards under FSDP), or None (best/).
    weights: the full model weights for best/ (rank 0 only), else None.
    common: {name: (suffix, state)} of every registered part and run_config (written by rank 0).
    """

    step: int
    rank: int
    world_size: int
    state: dict | None
    weights: dict | None
    rng: dict
    common: dict
    hf_config: object
    tokenizer: object  # a PreTrainedTokenizerFast

    @property
    def is_writer_of_common_files(self) -> bool:
        return self.rank == 0


def sharded_state(model, optimizer) -> dict:
    """The DCP state dicts {"model", "optim"} keyed by parameter name, as each rank holds them (no gathering).

    `model` is the unwrapped model (plain, DDP's module, or FSDP2-sharded) and `optimizer` the torch optimizer.
    One format for all of them, so a checkpoint resumes on any world size and sharding.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def tensor_bytes(t) -> int:
    """Bytes this rank holds of `t` (a DTensor's local shard only)."""
    t = getattr(t, "_local_tensor", t)
    return t.numel() * t.element_size()


def tensor_leaves(state: dict, path: tuple = ()):
    """(path, tensor) for every tensor in a nested dict of state."""
    for key, value in state.items():
        if isinstance(value, dict):
            yield from tensor_leaves(value, path + (key,))
        elif isinstance(value, torch.Tensor):
            yield path + (key,), value


def own_share(state: dict, rank: int, world_size: int) -> dict:
    """The part of a replicated (DDP) `state` this rank writes: whole tensors dealt out by size, largest first, each
    to the rank with the fewest bytes so far, so every rank stages about 1/world of the checkpoint instead of all.

    DCP writes each tensor once, from whichever rank holds it, and merges every rank's index: the checkpoint is
    the same as one where every rank offered everything. Sharded (FSDP2) tensors and non-tensor values stay on
    every rank (DTensor shards are already this rank's own; the small values DCP writes once).
    """
    leaves = [(tensor_bytes(t), path) for path, t in tensor_leaves(state) if not hasattr(t, "_local_tensor")]
    load, owner = [0] * world_size, {}
    for size, path in sorted(leaves, key=lambda x: (-x[0], str(x[1]))):  # the same order on every rank
        r = min(range(world_size), key=lambda i: (load[i], i))
        load[r] += size
        owner[path] = r

    def keep(node, path):
        out = {}
        for key, value in node.items():
            if isinstance(value, dict) and value:
                if sub := keep(value, path + (key,)):
                    out[key] = sub
            elif owner.get(path + (key,), rank) == rank:
                out[key] = value
        return out

    return keep(state, ())


class StagedState(dict):
    """A staged {"model", "optim"}: a dict the Stager can hold a weak reference to (plain dicts take none)."""


@dataclass
class _Buffers:
    stager: object  # torch's DefaultStager: its cache maps each source storage to its CPU copy
    cuda: bool
    staged: weakref.ref | None = None  # the snapshot these buffers back now; dead once it is written

    def idle(self) -> bool:
        return self.staged is None or self.staged() is None


class Stager:
    """Staging buffers kept for the run, as torchtitan keeps its own: the first save allocates (and on CUDA pins)
    a CPU copy of this rank's share; every later save copies into the same buffers instead of allocating,
    page-faulting and pinning it all again. A set is reused once the snapshot it backs is gone (written); while an
    older one is still being written a second set is made, and sets found idle beside the one reused are freed,
    so one set (checkpoint / world_size bytes: 2.1 GB per rank for the 1.2B preset on 8 GPUs) stays between saves.
    Buffers follow the tensors they copy: a source storage that is freed takes its copy with it."""

    def __init__(self):
        self._sets: list[_Buffers] = []

    def stage(self, state: dict) -> StagedState:
        """A CPU copy of `state` (DTensor shards stay shards); pinned memory when `state` is on a CUDA device."""
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        cuda = any(t.device.type == "cuda" for _, t in tensor_leaves(state))
        use = next((b for b in self._sets if b.cuda == cuda and b.idle()), None)
        for extra in [b for b in self._sets if b is not use and b.idle()]:
            extra.stager.close()
            self._sets.remove(extra)
        if use is None:
            use = _Buffers(DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                        use_async_staging=False, use_non_blocking_copy=cuda)), cuda)
            self._sets.append(use)
        staged = StagedState(use.stager.stage(state))
        use.staged = weakref.ref(staged)
        return staged


_stager = Stager()  # one run per process: its buffers live as long as the model and optimizer they copy


def stage(state: dict) -> StagedState:
    """A CPU copy of `state` in this process's kept staging buffers (see Stager)."""
    return _stager.stage(state)


def staged_share(model, optimizer, rank: int, world_size: int) -> dict:
    """This rank's part of {"model", "optim"} copied to the CPU: about checkpoint / world_size bytes, DDP or FSDP2."""
    return stage(own_share(sharded_state(model, optimizer), rank, world_size))


def full_weights(model) -> dict:
    """The unsharded model weights on the CPU of rank 0 (empty elsewhere); a collective under FSDP.

    Only best/ and final/ need them (from_pretrained format): weights, never the optimizer state.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    live = {p.data_ptr() for p in model.parameters()}
    # A CPU model's state dict is its live parameters: copy those, training goes on changing them.
    return {k: v.clone() if v.data_ptr() in live else v for k, v in weights.items()}


# What a stop on a signal can move per rank and second: a conservative local disk, and one GCS upload stream.
WRITE_BYTES_PER_S = 500e6
UPLOAD_BYTES_PER_S = 100e6


def grace_warning(save_bytes: int, world_size: int, grace_seconds: float, bucket: bool) -> str | None:
    """A start-up line when --grace-seconds cannot hold a save of this model (None when it can).

    `save_bytes`: the sharded state of one save over all ranks (the weights and the optimizer's state, as
    utils.optim.state_bytes counts it); each rank writes (and uploads) only its shard.
    """
    shard = save_bytes / world_size
    need = shard / WRITE_BYTES_PER_S + (shard / UPLOAD_BYTES_PER_S if bucket else 0)
    if need <= grace_seconds:
        return None
    where = ("the bucket keeps the last checkpoint whose upload finished (a fresh machine resumes from it); "
             "the local disk also gets the current step if its write finishes") if bucket else \
        "the current step survives only if its local write finishes, else the last periodic step folder"
    return (f"--grace-seconds {grace_seconds:g} cannot hold a save of {shard / 1e9:.2f} GB per rank (about "
            f"{need:.0f} s at {WRITE_BYTES_PER_S / 1e6:.0f} MB/s to disk"
            f"{f' and {UPLOAD_BYTES_PER_S / 1e6:.0f} MB/s to the bucket' if bucket else ''}): "
            f"on SIGTERM the run saves what fits; {where}. Save more often (--save-every) to lose less")
