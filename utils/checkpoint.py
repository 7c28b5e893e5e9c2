"""Local checkpoints: a step folder written atomically with its `COMPLETE` marker last.

Layout of `checkpoints/<run>/step-00000100/` (also `best/` and `final/`):
  config.json + model.safetensors   save_pretrained: AutoModelForCausalLM.from_pretrained loads the folder
  tokenizer.json + tokenizer_config.json   AutoTokenizer.from_pretrained loads the folder
  optimizer.pt, scheduler.pt, scaler.pt (fp16 only), rng.pt
  loader.json, trainer.json, metrics.json (the loss history), run_config.json
  COMPLETE                           JSON {step, files: {name: size}}; written last
A folder counts only when COMPLETE exists and every file it lists has the recorded size.

Saving is split in two so the slow part can run off the training thread: `capture()` copies the state
off the device (the only blocking part), `write()` puts it on disk.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from utils.atomic import atomic_write, atomic_write_json
from utils.errors import PiconeoxError

MARKER = "COMPLETE"
STEP_RE = re.compile(r"^step-(\d{8})$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _to_cpu(obj):
    """A deep copy with every tensor cloned to CPU (training may go on mutating the originals)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class Snapshot:
    """Everything a checkpoint holds, already on the CPU."""

    step: int
    model: object  # the unwrapped model: gives save_pretrained its config and tied-weight info
    model_state: dict
    optimizer: dict
    scheduler: dict
    scaler: dict | None
    rng: dict
    loader: dict
    trainer: dict
    metrics: dict
    run_config: dict
    tokenizer: object  # a PreTrainedTokenizerFast


def full_state(model, optimizer=None) -> tuple[dict, dict]:
    """Unsharded model and optimizer state dicts, keyed by parameter name, on the CPU.

    torch.distributed.checkpoint's helpers give one format for a plain module, DDP and FSDP, so a
    checkpoint resumes on any world size and sharding. Under FSDP this is a collective: every rank
    must call it (non-main ranks get empty dicts).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if optimizer is None:  # best/: weights only, no optimizer states to gather
        return get_model_state_dict(model, options=options), {}
    return get_state_dict(model, optimizer, options=options)


def load_optimizer_state(model, optimizer, state: dict) -> None:
    """The inverse of `full_state` for the optimizer (every rank calls it; FSDP re-shards it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))


def capture(step, model, optimizer, scheduler, scaler, loader, trainer, metrics, run_config, tokenizer) -> Snapshot:
    """Copy the training state off the device; the training loop may continue right after.

    `model` is the unwrapped model and `optimizer` the torch optimizer (None for a weights-only snapshot).
    Under FSDP every rank must call this (see `full_state`); only the main process's snapshot holds the weights.
    """
    model_state, optimizer_state = full_state(model, optimizer)
    return Snapshot(
        step=step,
        model=model,
        model_state=_to_cpu(model_state),
        optimizer=_to_cpu(optimizer_state),
        scheduler=scheduler.state_dict() if optimizer is not None else None,
        scaler=_to_cpu(scaler.state_dict()) if scaler is not None else None,
        rng=rng_state(),
        loader=loader.state_dict(),
        trainer=trainer.state_dict(),
        metrics=metrics.state_dict(),
        run_config=run_config,
        tokenizer=tokenizer,
    )


def write(snap: Snapshot, folder: Path, weights_only: bool = False) -> Path:
    """Write `snap` into `folder` atomically: a temp sibling folder, COMPLETE last, then a rename.

    `weights_only` (used for best/) leaves out the optimizer, scheduler, scaler and RNG states.
    """
    tmp = _fresh_tmp(folder)
    snap.model.save_pretrained(tmp, state_dict=snap.model_state, safe_serialization=True)
    snap.tokenizer.save_pretrained(tmp)
    if not weights_only:
        for name, obj in (("optimizer.pt", snap.optimizer), ("scheduler.pt", snap.scheduler),
                          ("rng.pt", snap.rng), ("scaler.pt", snap.scaler)):
            if obj is not None:
                with atomic_write(tmp / name) as f:
                    torch.save(obj, f)
    atomic_write_json(tmp / "loader.json", snap.loader)
    atomic_write_json(tmp / "trainer.json", snap.trainer)
    atomic_write_json(tmp / "metrics.json", snap.metrics)
    atomic_write_json(tmp / "run_config.json", snap.run_config)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    atomic_write_json(tmp / MARKER, {"step": snap.step, "files": files})
    return _swap_into_place(tmp, Path(folder))


def link_copy(src: Path, folder: Path) -> Path:
    """Publish a complete checkpoint under another name (final/) with hard links: no second write."""
    tmp = _fresh_tmp(folder)
    for path in Path(src).iterdir():
        if path.is_file():
            try:
                os.link(path, tmp / path.name)
            except OSError:  # a filesystem without hard links (some network mounts): copy instead
                shutil.copy2(path, tmp / path.name)
    return _swap_into_place(tmp, Path(folder))


def _fresh_tmp(folder: Path) -> Path:
    tmp = Path(folder).with_name(f".{Path(folder).name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _swap_into_place(tmp: Path, folder: Path) -> Path:
    """Replace an older folder of the same name (best/, final/, a re-saved step) only once `tmp` is complete."""
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def check_complete(folder: Path) -> str | None:
    """None when `folder` is a complete checkpoint, else a one-line reason."""
    folder = Path(folder)
    marker = folder / MARKER
    if not marker.is_file():
        return f"{folder} has no {MARKER} marker (an interrupted save)"
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{folder}/{MARKER} is unreadable"
    for name, size in files.items():
        path = folder / name
        if not path.is_file():
            return f"{folder} is damaged: {name} is missing"
        if path.stat().st_size != size:
            return f"{folder} is damaged: {name} has {path.stat().st_size} bytes, expected {size}"
    return None


def step_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) for every step-XXXXXXXX folder, complete or not, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := STEP_RE.match(p.name))]
    return sorted(found)


def latest_complete(run_dir: Path, warn=print) -> Path | None:
    """The highest complete step folder; damaged newer ones are reported with `warn` and skipped."""
    for _, folder in reversed(step_folders(run_dir)):
        reason = check_complete(folder)
        if reason is None:
            return folder
        warn(f"skipping checkpoint: {reason}")
    return None


def rotate(run_dir: Path, keep_last: int) -> list[Path]:
    """Keep the newest `keep_last` complete step folders; delete every step folder older than those."""
    folders = step_folders(run_dir)
    complete = [step for step, folder in folders if check_complete(folder) is None]
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
    """A complete checkpoint folder from a folder or a run directory, or a one-line PiconeoxError."""
    path = Path(path)
    if not path.exists():
        raise PiconeoxError(f"--resume {path}: no such checkpoint or run directory")
    if (path / MARKER).exists() or STEP_RE.match(path.name) or path.name in ("best", "final"):
        reason = check_complete(path)
        if reason:
            raise PiconeoxError(f"--resume {path}: {reason}")
        if not (path / "optimizer.pt").exists():
            raise PiconeoxError(f"--resume {path}: a weights-only checkpoint (best/); resume from a step-XXXXXXXX "
                                "or final/ folder, or load these weights with utils.generate / rp2040.export")
        return path
    latest = latest_complete(path, warn)
    if latest is None:
        raise PiconeoxError(f"--resume {path}: no complete step-XXXXXXXX checkpoint in this run directory")
    return latest


def load(folder: Path) -> dict:
    """The non-model parts of a checkpoint (weights load through from_pretrained / safetensors)."""
    folder = Path(folder)
    out = {name[:-5]: json.loads((folder / name).read_text())
           for name in ("loader.json", "trainer.json", "metrics.json", "run_config.json")}
    for name in ("optimizer", "scheduler", "rng", "scaler"):
        path = folder / f"{name}.pt"
        out[name] = torch.load(path, map_location="cpu", weights_only=False) if path.exists() else None
    return out


def load_model(folder: Path):
    """The checkpoint's model in float32 through from_pretrained (which maps saved names such as embed_out)."""
    from transformers import GPTNeoXForCausalLM

    return GPTNeoXForCausalLM.from_pretrained(Path(folder), dtype=torch.float32, attn_implementation="sdpa")
