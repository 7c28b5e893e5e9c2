"""Checkpoints: sharded step folders in torch.distributed.checkpoint (DCP) format, `COMPLETE` marker last.

Layout of `checkpoints/<run>/step-00000100/`:
  __0_0.distcp, __1_0.distcp, ...  DCP: {"model": ..., "optim": ...}; each rank writes its own shard file
  .metadata                         DCP's index (written by rank 0 once every shard is written)
  rng-00000.pt, rng-00001.pt, ...   each rank's RNG (CPU and its own GPU)
  config.json, tokenizer.json, tokenizer_config.json   the model shape and tokenizer (AutoTokenizer loads them)
  scheduler.pt, scaler.pt (fp16 only), loader.json, trainer.json, metrics.json, run_config.json
  COMPLETE                          JSON {step, world_size, files: {name: {size, crc32c}}}; written last, by rank 0,
                                    only after every rank reported its files written (and uploaded)
`best/` and `final/` also hold `model.safetensors` (consolidated weights): AutoModelForCausalLM.from_pretrained
loads them. Any step folder can be consolidated later with `python -m utils.consolidate`.

A folder counts only when COMPLETE exists and every file it lists has the recorded size; loading for a resume
(and utils.generate, rp2040.export) also checks each file's crc32c, so same-size corruption is caught too.
DCP reshards on load: a checkpoint of N ranks resumes on M ranks, under DDP or FSDP alike.

Saving is split in two so the slow part runs off the training thread: `capture()` copies this rank's shard off
the device (the only blocking part), `write_shards()` / `write_common()` put it on disk (utils/uploader.py).
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

from utils.atomic import atomic_write, atomic_write_json
from utils.crc import crc32c_file
from utils.errors import PiconeoxError
from utils.portable import make_portable

MARKER = "COMPLETE"
STEP_RE = re.compile(r"^step-(\d{8})$")
DCP_INDEX = ".metadata"
# A single process saves and loads without a process group on purpose: DCP's warning about it is noise.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
JSON_PARTS = ("loader", "trainer", "metrics", "run_config")
TORCH_PARTS = ("scheduler", "scaler")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rng_name(rank: int) -> str:
    return f"rng-{rank:05d}.pt"


# --- RNG --------------------------------------------------------------------------------------------------

def rng_state() -> dict:
    """This process's RNG: Python, NumPy, torch CPU and only the GPU this rank uses (a box with fewer GPUs
    must still resume: one state per visible GPU would not fit there)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # onto the current device, whatever its index was when saved


# --- capture (training thread) ----------------------------------------------------------------------------

def checkpoint_group(timeout: timedelta):
    """A gloo process group for the background savers (None when not distributed).

    Collectives of checkpoint threads must never interleave with the training's on the same group, and a
    save may wait on a slow upload of another rank: hence its own group, bounded by `timeout` (the run's
    start-up collective timeout, which also covers a synchronous save), so a dead rank fails the save.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=timeout)


@dataclass
class Snapshot:
    """One rank's part of a checkpoint, already on the CPU.

    state: {"model": ..., "optim": ...} with this rank's shards (DTensor shards under FSDP), or None (best/).
    weights: the full model weights for best/ (rank 0 only), else None.
    common: scheduler, scaler, loader, trainer, metrics and run_config states (written by rank 0).
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


def stage(state: dict) -> dict:
    """A CPU copy of `state` (DTensor shards stay shards); pinned memory on CUDA for a fast copy off the GPU."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    cuda = torch.cuda.is_available()
    stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False,
                                          use_non_blocking_copy=cuda))
    try:
        return stager.stage(state)
    finally:
        stager.close()


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


def capture(step, model, optimizer, scheduler, scaler, loader, trainer, metrics, run_config, tokenizer, *,
            rank: int = 0, world_size: int = 1, weights_only: bool = False) -> Snapshot:
    """Copy this rank's part of the training state off the device; the training loop may continue right after.

    Every rank must call this at the same point (FSDP's state-dict calls are collectives). `weights_only`
    (best/) gathers the full weights onto rank 0 instead of sharding model and optimizer.
    """
    common = {"scheduler": None if weights_only else scheduler.state_dict(),
              "scaler": scaler.state_dict() if scaler is not None and not weights_only else None,
              "loader": loader.state_dict(), "trainer": trainer.state_dict(), "metrics": metrics.state_dict(),
              "run_config": run_config}
    return Snapshot(
        step=step, rank=rank, world_size=world_size,
        state=None if weights_only else staged_share(model, optimizer, rank, world_size),
        weights=full_weights(model) if weights_only else None,
        rng=rng_state(), common=common, hf_config=model.config, tokenizer=tokenizer)


# What a stop on a signal can move per rank and second: a conservative local disk, and one GCS upload stream.
WRITE_BYTES_PER_S = 500e6
UPLOAD_BYTES_PER_S = 100e6


def grace_warning(n_params: int, world_size: int, grace_seconds: float, bucket: bool) -> str | None:
    """A start-up line when --grace-seconds cannot hold a save of this model (None when it can).

    Each rank writes (and uploads) only its shard: fp32 weights and two AdamW states, 12 bytes a parameter.
    """
    shard = 12 * n_params / world_size
    need = shard / WRITE_BYTES_PER_S + (shard / UPLOAD_BYTES_PER_S if bucket else 0)
    if need <= grace_seconds:
        return None
    where = ("the bucket keeps the last checkpoint whose upload finished (a fresh machine resumes from it); "
             "the local disk also gets the current step if its write finishes") if bucket else \
        "the current step survives only if its local write finishes, else the last periodic step folder"
    return (f"--grace-seconds {grace_seconds:g} cannot hold a save of {shard / 1e9:.2f} GB per rank (about "
            f"{need:.0f} s at {WRITE_BYTES_PER_S / 1e6:.0f} MB/s to disk{f' and {UPLOAD_BYTES_PER_S / 1e6:.0f} MB/s to the bucket' if bucket else ''}): "
            f"on SIGTERM the run saves what fits; {where}. Save more often (--save-every) to lose less")


# --- writing (background thread) --------------------------------------------------------------------------

def write_shards(snap: Snapshot, folder: Path, group=None) -> list[str]:
    """Write this rank's shard (a collective with the other ranks' savers) and its RNG; rank 0 also writes DCP's
    index and the common files. Returns the names this rank wrote."""
    import torch.distributed.checkpoint as dcp

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dcp.save(snap.state, storage_writer=dcp.FileSystemWriter(folder), process_group=group,
             no_dist=snap.world_size == 1)
    with atomic_write(folder / rng_name(snap.rank)) as f:
        torch.save(snap.rng, f)
    names = sorted(p.name for p in folder.glob(f"__{snap.rank}_*.distcp")) + [rng_name(snap.rank)]
    if snap.is_writer_of_common_files:
        names += [DCP_INDEX] + write_common(snap, folder)
    return names


def write_common(snap: Snapshot, folder: Path) -> list[str]:
    """config.json, the tokenizer and the small states; returns the names written."""
    snap.hf_config.save_pretrained(folder)
    names = ["config.json"] + [Path(p).name for p in snap.tokenizer.save_pretrained(folder)]
    names += make_portable(folder)  # transformers 4.x, 5.x and the converters read it the same way
    for name in JSON_PARTS:
        atomic_write_json(folder / f"{name}.json", snap.common[name])
        names.append(f"{name}.json")
    for name in TORCH_PARTS:
        if snap.common[name] is not None:
            with atomic_write(folder / f"{name}.pt") as f:
                torch.save(snap.common[name], f)
            names.append(f"{name}.pt")
    return sorted(set(names))


def manifest(folder: Path, names) -> dict[str, dict]:
    """{name: {size, crc32c}} of files in `folder`: what the COMPLETE marker records."""
    return {name: {"size": (folder / name).stat().st_size, "crc32c": crc32c_file(folder / name)} for name in names}


def write_marker(folder: Path, step: int, world_size: int, files: dict[str, dict]) -> None:
    atomic_write_json(Path(folder) / MARKER, {"step": step, "world_size": world_size, "files": dict(sorted(files.items()))})


def write_weights(snap: Snapshot, folder: Path) -> Path:
    """best/: consolidated weights (from_pretrained format), tokenizer and small states, atomically."""
    tmp = fresh_tmp(folder)
    save_pretrained_weights(snap.hf_config, snap.weights, tmp)
    write_common(snap, tmp)
    write_marker(tmp, snap.step, snap.world_size, manifest(tmp, [p.name for p in tmp.iterdir() if p.is_file()]))
    return swap_into_place(tmp, Path(folder))


def save_pretrained_weights(hf_config, weights: dict, folder: Path) -> None:
    """config.json + model.safetensors from a full state dict, without allocating a second model."""
    from transformers import GPTNeoXForCausalLM

    with torch.device("meta"):
        shell = GPTNeoXForCausalLM(hf_config)
    shell.save_pretrained(folder, state_dict=weights, safe_serialization=True)


def prepare_step_folder(folder: Path) -> None:
    """Remove what an interrupted earlier save of this step left (it is not complete, or is being replaced)."""
    shutil.rmtree(folder, ignore_errors=True)


def link_copy(src: Path, folder: Path, extra: Path | None = None) -> Path:
    """Publish a complete checkpoint under another name (final/) with hard links: no second write.

    `extra`: a folder whose files are added (the consolidated weights), overriding files of the same name.
    """
    tmp = fresh_tmp(folder)
    sources = {p.name: p for p in Path(src).iterdir() if p.is_file() and p.name != MARKER}
    if extra is not None:
        sources.update({p.name: p for p in Path(extra).iterdir() if p.is_file() and p.name != MARKER})
    for name, path in sources.items():
        try:
            os.link(path, tmp / name)
        except OSError:  # a filesystem without hard links (some network mounts): copy instead
            shutil.copy2(path, tmp / name)
    marker = json.loads((Path(src) / MARKER).read_text())
    files = {**marker["files"], **(manifest(tmp, [p.name for p in Path(extra).iterdir() if p.name != MARKER])
                                   if extra is not None else {})}
    write_marker(tmp, marker["step"], marker.get("world_size", 1), files)
    return swap_into_place(tmp, Path(folder))


def fresh_tmp(folder: Path) -> Path:
    tmp = Path(folder).with_name(f".{Path(folder).name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def swap_into_place(tmp: Path, folder: Path) -> Path:
    """Replace an older folder of the same name (best/, final/) only once `tmp` is complete."""
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


# --- finding, checking, rotating --------------------------------------------------------------------------

def read_marker(folder: Path) -> dict | None:
    """The parsed COMPLETE marker of `folder`, or None when it is missing or unreadable."""
    try:
        marker = json.loads((Path(folder) / MARKER).read_text())
        return marker if isinstance(marker.get("files"), dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def check_files(folder: Path, files: dict[str, dict], verify: bool = True) -> str | None:
    """None when every file of a marker's list is in `folder` with its size (and crc32c when `verify`)."""
    folder = Path(folder)
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{folder} is damaged: {name} is missing"
        if path.stat().st_size != want["size"]:
            return f"{folder} is damaged: {name} has {path.stat().st_size} bytes, expected {want['size']}"
        if verify and crc32c_file(path) != want["crc32c"]:
            return f"{folder} is damaged: {name} does not match its crc32c (same size, different bytes)"
    return None


def check_complete(folder: Path, verify: bool = False) -> str | None:
    """None when `folder` is a complete checkpoint, else a one-line reason. `verify` also checks every crc32c."""
    folder = Path(folder)
    if not (folder / MARKER).is_file():
        return f"{folder} has no {MARKER} marker (an interrupted save)"
    marker = read_marker(folder)
    if marker is None or not all(isinstance(v, dict) and {"size", "crc32c"} <= v.keys() for v in marker["files"].values()):
        return f"{folder}/{MARKER} is unreadable (or from an older piconeox format)"
    return check_files(folder, marker["files"], verify)


def step_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) for every step-XXXXXXXX folder, complete or not, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := STEP_RE.match(p.name))]
    return sorted(found)


def latest_complete(run_dir: Path, warn=print, verify: bool = True) -> Path | None:
    """The highest complete step folder; damaged newer ones are reported with `warn` and skipped."""
    for _, folder in reversed(step_folders(run_dir)):
        reason = check_complete(folder, verify)
        if reason is None:
            return folder
        warn(f"skipping checkpoint: {reason}")
    return None


def rotate(run_dir: Path, keep_last: int, also_complete: set[int] = frozenset()) -> list[Path]:
    """Keep the newest `keep_last` complete step folders; delete every step folder older than those.

    `also_complete`: steps known complete elsewhere (the marker lives on rank 0's machine): a machine holding
    only its own shards rotates by them.
    """
    folders = step_folders(run_dir)
    complete = sorted({step for step, folder in folders if check_complete(folder) is None} | set(also_complete))
    if len(complete) <= keep_last:
        return []
    cutoff = complete[-keep_last]
    removed = [folder for step, folder in folders if step < cutoff]
    # Leftovers of interrupted writes or swaps (.step-N.tmp, .step-N.old) below the cutoff go too.
    removed += [p for p in Path(run_dir).glob(".step-*.*")
                if (m := re.match(r"^\.step-(\d{8})\.(tmp|old)$", p.name)) and int(m.group(1)) < cutoff]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def resolve_resume(path: Path, warn=print) -> Path:
    """A complete, verified checkpoint folder from a folder or a run directory, or a one-line PiconeoxError."""
    path = Path(path)
    if not path.exists():
        raise PiconeoxError(f"--resume {path}: no such checkpoint or run directory")
    if (path / MARKER).exists() or STEP_RE.match(path.name) or path.name in ("best", "final"):
        reason = check_complete(path, verify=True)
        if reason:
            raise PiconeoxError(f"--resume {path}: {reason}")
        if not (path / DCP_INDEX).exists():
            raise PiconeoxError(f"--resume {path}: a weights-only checkpoint (best/); resume from a step-XXXXXXXX "
                                "or final/ folder, or load these weights with utils.generate / rp2040.export")
        return path
    latest = latest_complete(path, warn)
    if latest is None:
        raise PiconeoxError(f"--resume {path}: no complete step-XXXXXXXX checkpoint in this run directory")
    return latest


# --- loading ----------------------------------------------------------------------------------------------

def load_common(folder: Path, rank: int = 0) -> dict:
    """The small parts of a checkpoint: json states, scheduler, scaler, and this rank's RNG (rank 0's when the
    checkpoint had fewer ranks)."""
    folder = Path(folder)
    out = {name: json.loads((folder / f"{name}.json").read_text()) for name in JSON_PARTS}
    for name in TORCH_PARTS:
        path = folder / f"{name}.pt"
        out[name] = torch.load(path, map_location="cpu", weights_only=False) if path.exists() else None
    rng = folder / rng_name(rank)
    out["rng"] = torch.load(rng if rng.exists() else folder / rng_name(0), map_location="cpu", weights_only=False)
    return out


def load_sharded(folder: Path, model, optimizer) -> None:
    """Load model and optimizer state in place; every rank reads only the slices of its own shards (DCP
    reshards when the world size or sharding differ). Every rank must call this."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = sharded_state(model, optimizer)  # this rank's tensors: DCP fills them in place
    try:
        dcp.load(state, checkpoint_id=str(folder), no_dist=not dist.is_initialized())
    except Exception as e:  # CheckpointException wraps every rank's error; one line is enough for the user
        raise PiconeoxError(f"{folder}: cannot load the sharded state: {str(e).splitlines()[0][:300]}") from e
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
