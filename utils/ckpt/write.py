"""Writing checkpoint folders (on the saver thread): this rank's shards, the common files, best/ and final/.

Every folder is published atomically: shards then the COMPLETE marker (utils/ckpt/uploader.py) for step
folders; a temporary folder swapped into place for best/ and final/.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

import torch

from utils.atomic import atomic_write_json
from utils.ckpt.format import (DCP_INDEX, MARKER, STEP_RE, WEIGHTS_FILE, check_complete, manifest, read_marker,
                               regular_file, rng_name, write_marker)
from utils.ckpt.load import checked, read_weights
from utils.ckpt.state import Snapshot, rng_to_json, tensor_bytes, tensor_leaves
from utils.errors import PiconeoxError
from utils.atomic import atomic_dir, check_output_dir
from utils.diskfull import check_space, one_line_when_full, raise_if_full
from utils.ckpt.hf.portable import make_portable


def write_shards(snap: Snapshot, folder: Path, group=None) -> list[str]:
    """Write this rank's shard (a collective with the other ranks' savers) and its RNG; rank 0 also writes DCP's
    index and the common files. Returns the names this rank wrote."""
    import torch.distributed.checkpoint as dcp

    from torch.distributed.checkpoint.api import CheckpointException

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    needed = state_bytes(snap.state)
    what = f"checkpoint {folder.name} (rank {snap.rank}'s shard)"
    check_space(folder.parent, needed, what)
    try:
        # per_thread_copy_ahead=0: the state is staged on the CPU already; DCP's default "copy ahead from the GPU"
        # loader asks torch.cuda for a stream whenever a GPU is visible, opening a context on a CPU run's GPU 0
        dcp.save(snap.state, storage_writer=dcp.FileSystemWriter(folder, per_thread_copy_ahead=0),
                 process_group=group, no_dist=snap.world_size == 1)
        atomic_write_json(folder / rng_name(snap.rank), rng_to_json(snap.rng))  # no pickle: a load builds no objects
    except (Exception, CheckpointException) as e:  # DCP's is a BaseException: it would kill the saver thread
        raise_if_full(e, folder.parent, what, needed)
        if isinstance(e, CheckpointException):
            first = next(iter(e.failures.values()), (e,))[0]
            if interrupted(first):  # a second Ctrl-C during the stop's save (on the main thread) ends the run at
                raise KeyboardInterrupt from None  # once (130), not just this save
            raise PiconeoxError(f"{type(first).__name__}: {first}") from None
        raise
    names = sorted(p.name for p in folder.glob(f"__{snap.rank}_*.distcp")) + [rng_name(snap.rank)]
    if snap.is_writer_of_common_files:
        names += [DCP_INDEX] + write_common(snap, folder)
    return names


def interrupted(e: BaseException | None) -> bool:
    """Whether `e` is a KeyboardInterrupt or came from one: DCP wraps every BaseException in its own, and torch's zip
    writer, cut short by it, raises a RuntimeError ("unexpected pos") whose context it is."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def state_bytes(state: dict) -> int:
    """Bytes of every tensor in a nested state dict (this rank's shards): what its files need on disk, at least."""
    return sum(tensor_bytes(t) for _, t in tensor_leaves(state))


def write_common(snap: Snapshot, folder: Path) -> list[str]:
    """config.json, the tokenizer and one <name>.json per registered part; returns the names. Small states are
    JSON, never pickles: reading them can build no object and run no code."""
    snap.hf_config.save_pretrained(folder)
    names = ["config.json"] + [Path(p).name for p in snap.tokenizer.save_pretrained(folder)]
    names += make_portable(folder)  # transformers 4.x, 5.x and the converters read it the same way
    for name, (_, state) in snap.common.items():
        atomic_write_json(folder / f"{name}.json", state)
        names.append(f"{name}.json")
    return sorted(set(names))


def write_weights(snap: Snapshot, folder: Path) -> Path:
    """best/: consolidated weights (from_pretrained format), tokenizer and small states, atomically."""
    needed, what = state_bytes(snap.weights), f"checkpoint {Path(folder).name}"
    check_space(Path(folder).parent, needed, what)
    with one_line_when_full(Path(folder).parent, what, needed), atomic_dir(folder) as tmp:
        save_pretrained_weights(snap.hf_config, snap.weights, tmp)
        write_common(snap, tmp)
        write_marker(tmp, snap.step, snap.world_size, manifest(tmp, [p.name for p in tmp.iterdir() if p.is_file()]))
    return Path(folder)


def save_pretrained_weights(hf_config, weights: dict, folder: Path) -> None:
    """config.json + model.safetensors from a full state dict, without allocating a second model."""
    from transformers import GPTNeoXForCausalLM

    with torch.device("meta"):
        shell = GPTNeoXForCausalLM(hf_config)
    shell.save_pretrained(folder, state_dict=weights, safe_serialization=True)


def prepare_step_folder(folder: Path) -> None:
    """Remove what an interrupted earlier save of this step left (it is not complete, or is being replaced); a
    link in its place is removed, never written through: the checkpoint stays inside the run folder."""
    if Path(folder).is_symlink():
        Path(folder).unlink()
    shutil.rmtree(folder, ignore_errors=True)


def link_copy(src: Path, folder: Path, extra: Path | None = None) -> Path:
    """Publish a complete checkpoint under another name (final/) with hard links: no second write.

    `extra`: a folder whose files are added (the consolidated weights), overriding files of the same name.
    """
    marker = read_marker(src)  # only what the (checked) marker lists: never an unlisted file or a link
    sources = {name: regular_file(Path(src), name) for name in marker["files"]}
    if extra is not None:
        sources.update({p.name: p for p in Path(extra).iterdir() if p.is_file() and p.name != MARKER})
    with atomic_dir(folder) as tmp:
        for name, path in sources.items():
            try:
                os.link(path, tmp / name)
            except OSError:  # a filesystem without hard links (some network mounts): copy instead
                shutil.copy2(path, tmp / name)
        files = {**marker["files"], **(manifest(tmp, [p.name for p in Path(extra).iterdir() if p.name != MARKER])
                                       if extra is not None else {})}
        write_marker(tmp, marker["step"], marker.get("world_size", 1), files)
    return Path(folder)


def write_consolidated(folder: Path, into: Path, weights: str | None = None) -> None:
    """config.json + model.safetensors of the checkpoint `folder`, written into the existing folder `into`;
    `weights`: the sharded part whose weights replace the model's (e.g. "ema"), None for the model's own."""
    from utils.ckpt.hf.hf_folder import checked_config

    state = read_weights(folder)
    if weights:
        state.update(read_weights(folder, weights))
    save_pretrained_weights(checked_config(folder), state, into)
    make_portable(into, tokenizer_dir=folder)


@contextlib.contextmanager
def consolidate_into(folder: Path, beside: Path, weights: str | None = None) -> Iterator[Path]:
    """A temporary folder next to the output `beside` (removed afterwards) holding config.json +
    model.safetensors of `folder` (`weights`: as in write_consolidated): written where the output goes, never
    into the input's folder."""
    tmp = Path(beside).with_name(f".{Path(beside).name}.weights.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write_consolidated(folder, tmp, weights)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_consolidated(folder: Path) -> bool:
    """True for a from_pretrained folder with its marker, as consolidate() writes (what --out may replace)."""
    return (folder / MARKER).is_file() and (folder / WEIGHTS_FILE).is_file() and \
        not any(p.is_dir() for p in folder.iterdir())


def check_consolidate_out(out: Path) -> None:
    """Refuse an --out that is part of a run's checkpoints: a folder inside a checkpoint (rotation or the next
    save deletes it with that checkpoint) or a run's own final/, best/ or step folder (replacing it with
    from_pretrained weights loses the state a --resume needs)."""
    out = Path(os.path.abspath(out))  # `..` collapsed, links kept (a link into a checkpoint is caught below)
    for parent in out.parents:
        if (parent / MARKER).is_file() or (parent / DCP_INDEX).is_file() or STEP_RE.match(parent.name):
            raise PiconeoxError(f"--out {out} is inside the checkpoint {parent}, which is deleted or replaced as a "
                                "whole (rotation, a later save): choose a folder outside the run's checkpoints, "
                                "e.g. models/NAME")
    try:
        run_folder = any(STEP_RE.match(p.name) for p in out.parent.iterdir())
    except OSError:  # no such folder (yet), or unreadable: check_output_dir says which
        run_folder = False
    owned = out.name in ("final", "best") or out.name.startswith(".")  # and the run's temporaries: .step-N.tmp
    if (out / DCP_INDEX).is_file() or STEP_RE.match(out.name) or (run_folder and owned):
        raise PiconeoxError(f"--out {out} is one of the run's own checkpoints in {out.parent} (what --resume and "
                            "generate read; rotation deletes step folders): choose a folder outside the run's "
                            "checkpoints, e.g. models/NAME")


def consolidate(folder: Path, out: Path, weights: str | None = None) -> Path:
    """Write `folder`'s weights (`weights`: a sharded part's instead, e.g. "ema") as a from_pretrained folder
    `out` (atomically, marker last)."""
    folder, out = Path(folder), Path(out)
    if out.resolve() == folder.resolve():
        raise PiconeoxError(f"--out {out}: must differ from the checkpoint folder")
    check_consolidate_out(out)
    check_output_dir(out, "--out", is_consolidated, "a consolidated checkpoint")
    checked(folder)
    if not (folder / DCP_INDEX).is_file() and (folder / WEIGHTS_FILE).is_file():
        raise PiconeoxError(f"{folder} is consolidated already (its {WEIGHTS_FILE} loads with from_pretrained as it "
                            "is): copy the folder, or consolidate a step-XXXXXXXX or final/ folder")
    marker = read_marker(folder)
    # safetensors reports a full disk as its own SafetensorError, which the CLI's ENOSPC net does not catch
    with one_line_when_full(out.absolute().parent, f"--out {out}"), atomic_dir(out) as tmp:
        write_consolidated(folder, tmp, weights)
        for name in marker["files"]:  # the tokenizer and the small json states travel along: listed files only
            if name.startswith(("tokenizer", "special_tokens")) or (name.endswith(".json") and name != "config.json"):
                shutil.copy2(regular_file(folder, name), tmp / name)
        make_portable(tmp)  # also fixes the tokenizer files of a checkpoint written before utils.ckpt.hf.portable
        write_marker(tmp, marker["step"], marker.get("world_size", 1),
                     manifest(tmp, [p.name for p in tmp.iterdir() if p.is_file()]))
    return out


def publish_final(last: Path, final: Path, consolidate_weights: bool, log, weights: str | None = None) -> None:
    """final/: the last step (hard links) plus its weights consolidated for from_pretrained (`weights`: those of
    a sharded part such as "ema" instead of the model's); a stop on a signal skips the consolidation (no time
    for it) and says how to do it later."""
    try:
        _publish_final(last, final, consolidate_weights, log, weights)
    except OSError as e:
        raise_if_full(e, final.parent, f"{final.name}/ (hard links and the consolidated weights)")
        raise


def _publish_final(last: Path, final: Path, consolidate_weights: bool, log, weights: str | None) -> None:
    reason = check_complete(last)
    if reason:  # the save failed, or several machines hold the shards (the bucket has them all)
        log.warning(f"final/ not written: {reason}")
        return
    if not consolidate_weights:
        link_copy(last, final)
        log.info(f"{final}: resumable; for from_pretrained weights run python -m utils.consolidate {last} --out DIR"
                 + (f" --weights {weights}" if weights else ""))
        return
    with consolidate_into(last, final, weights) as folder:
        link_copy(last, final, extra=folder)
