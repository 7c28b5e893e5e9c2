"""The checkpoint format: folder names, the COMPLETE marker (written last, listing every file's size and
crc32c), checking and rotating step folders, and `find_checkpoint`: which folder the user meant.

Layout of `checkpoints/<run>/step-00000100/`:
  __0_0.distcp, __1_0.distcp, ...  DCP: {"model": ..., "optim": ..., sharded parts ("ema")}; each rank its own file
  .metadata                         DCP's index (written by rank 0 once every shard is written)
  rng-00000.json, rng-00001.json,   each rank's RNG (CPU and its own GPU); older checkpoints: rng-00000.pt
  config.json, tokenizer.json, tokenizer_config.json   the model shape and tokenizer (AutoTokenizer loads them)
  <part>.json                       one file per registered small part (utils/ckpt/parts.py): scheduler.json,
                                    scaler.json (fp16 only), loader.json, trainer.json, metrics.json; run_config.json
                                    (older checkpoints: scheduler.pt, scaler.pt, read through
                                    utils/ckpt/untrusted/bounded.py)
  COMPLETE                          JSON {step, world_size, files: {name: {size, crc32c}}}; written last, by rank 0,
                                    only after every rank reported its files written (and uploaded)
`best/` and `final/` also hold `model.safetensors` (consolidated weights): AutoModelForCausalLM.from_pretrained
loads them. Any step folder can be consolidated later with `python -m utils.consolidate`.

A folder counts only when COMPLETE exists and every file it lists has the recorded size; loading for a resume
(and utils.generate, rp2040.export) also checks each file's crc32c, so same-size corruption is caught too.
Every name the marker lists is a plain file name of the folder (no '/', '..', control characters) and each such
file is a regular file, never a symbolic link: nothing a load reads lies outside the folder (`marker_name`).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from utils.atomic import atomic_write_json
from utils.crc import crc32c_file
from utils.errors import PiconeoxError
from utils.textfile import SMALL_JSON_BYTES, read_json
from utils.storage.base import no_link_below, safe_relpath

MARKER = "COMPLETE"
STEP_RE = re.compile(r"^step-(\d{8})$")
DCP_INDEX = ".metadata"
WEIGHTS_FILE = "model.safetensors"
MAX_STEP = 10**8  # step-XXXXXXXX: eight digits
MAX_WORLD = 1 << 16  # ranks a checkpoint may come from


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def rng_name(rank: int, suffix: str = "json") -> str:
    """Rank `rank`'s RNG file: JSON now; `suffix="pt"` names an older checkpoint's pickle."""
    return f"rng-{rank:05d}.{suffix}"

def manifest(folder: Path, names) -> dict[str, dict]:
    """{name: {size, crc32c}} of files in `folder`: what the COMPLETE marker records."""
    return {name: {"size": (folder / name).stat().st_size, "crc32c": crc32c_file(folder / name)} for name in names}


def write_marker(folder: Path, step: int, world_size: int, files: dict[str, dict]) -> None:
    marker = {"step": step, "world_size": world_size, "files": dict(sorted(files.items()))}
    atomic_write_json(Path(folder) / MARKER, marker)


def read_marker(folder: Path) -> dict | None:
    """The parsed COMPLETE marker of `folder`, or None when it is missing, unreadable, lists a file without
    its size and crc32c (an older piconeox format), or has a step or world size no run writes."""
    if (Path(folder) / MARKER).is_symlink():  # never read through a link (check_complete says why)
        return None
    try:  # read_json: bounded in size, and JSON nested too deep is one line too
        marker = read_json(Path(folder) / MARKER, max_bytes=SMALL_JSON_BYTES)
    except PiconeoxError:
        return None
    files = marker.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, dict) and {"size", "crc32c"} <= v.keys()
                                              and all(type(v[k]) is int and v[k] >= 0 for k in ("size", "crc32c"))
                                              for v in files.values()):
        return None
    step, world = marker.get("step"), marker.get("world_size", 1)
    if not (type(step) is int and 0 <= step < MAX_STEP and type(world) is int and 1 <= world <= MAX_WORLD):
        return None
    return marker


def marker_name(name: str) -> str:
    """`name` when it may stand in a marker (a plain file name: the checkpoint folder is flat), else one line."""
    if "/" in safe_relpath(name):
        raise PiconeoxError(f"refusing file name {name!r}: a checkpoint's files are plain names, without '/'")
    return name


def regular_file(folder: Path, name: str) -> Path:
    """`folder/name` for a marker name that is a regular file there (not a link, FIFO or folder); else one line."""
    path = no_link_below(folder, marker_name(name))
    if path.exists() and not path.is_file():
        raise PiconeoxError(f"{path} is not a regular file: a checkpoint holds regular files only")
    return path


def foreign_entry(folder: Path) -> str | None:
    """Why `folder` is not a folder of regular files (it holds a link, a FIFO, a device or a socket), or None:
    whatever reads a checkpoint folder (transformers included) then reads nothing outside it and never blocks."""
    for path in sorted(Path(folder).iterdir()):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            kind = "a symbolic link" if path.is_symlink() else "not a regular file"
            return (f"{path} is {kind}: a checkpoint folder holds regular files only, never links (copy the file "
                    "in instead)")
    return None


def check_files(folder: Path, files: dict[str, dict], verify: bool = True) -> str | None:
    """None when every file of a marker's list is in `folder` with its size (and crc32c when `verify`): a plain
    name of a regular file, never a link, so nothing outside `folder` is stat'ed or read."""
    folder = Path(folder)
    try:
        paths = {name: regular_file(folder, name) for name in files}
    except PiconeoxError as e:
        return f"{folder}/{MARKER} is refused: {e}"
    for name, want in files.items():
        path = paths[name]
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
    if reason := foreign_entry(folder):
        return reason
    marker = read_marker(folder)
    if marker is None:
        return f"{folder}/{MARKER} is unreadable (or from an older piconeox format)"
    if (m := STEP_RE.match(folder.name)) and int(m.group(1)) != marker["step"]:
        return f"{folder}/{MARKER} says step {marker['step']}, but the folder is {folder.name}"
    return check_files(folder, marker["files"], verify)


def step_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) for every step-XXXXXXXX folder, complete or not, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    # A link named like a step folder is no step folder: never read from, written to or removed through.
    found = [(int(m.group(1)), p) for p in run_dir.iterdir()
             if p.is_dir() and not p.is_symlink() and (m := STEP_RE.match(p.name))]
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



def not_a_checkpoint(path: Path) -> str:
    """Why the folder `path` is no checkpoint: a folder of runs, a run without best/ or final/, or neither."""
    subs = sorted(p.name for p in path.iterdir() if p.is_dir())
    runs = [s for s in subs if any((path / s / c).is_dir() for c in ("best", "final"))]
    steps = [s for s in subs if STEP_RE.match(s)]
    give = "give checkpoints/<run>/best, final or step-XXXXXXXX"
    if runs:
        more = ", ..." if len(runs) > 3 else ""
        return f"{path} is a folder of runs ({', '.join(runs[:3])}{more}), not a checkpoint: {give}"
    if steps:
        return f"{path} is a run folder without best/ or final/: give one of its steps, e.g. {path / steps[-1]}"
    return f"{path} holds no checkpoint: {give}"


def find_checkpoint(path: str | Path, *, resume: bool = False, flag: str = "", warn=print) -> Path:
    """The checkpoint folder the user meant, checked; every problem is one PiconeoxError line.

    `path` is a checkpoint folder (best/, final/, step-XXXXXXXX/, or a from_pretrained folder) or a run directory.
    For a resume (`resume=True`) a run directory means its newest complete step folder, every file's crc32c is
    checked and the folder must hold the sharded state; otherwise a run directory means its best/ (else final/)
    and the loader checks the crc32c as it reads. `flag` prefixes the messages (e.g. "--resume "); `warn` reports
    damaged step folders that a run directory's newest complete one was chosen over.
    """
    path = Path(path)
    if not path.is_dir():
        what = "checkpoint or run directory" if resume else "checkpoint folder"
        problem = f"is a file, not a {what}" if path.exists() else f"no such {what}"
        raise PiconeoxError(f"{flag}{path}: {problem} (give checkpoints/<run>, or its best, final or "
                            "step-XXXXXXXX folder)")
    is_checkpoint = ((path / MARKER).exists() or STEP_RE.match(path.name) or path.name in ("best", "final")
                     or (path / "config.json").is_file())
    if not is_checkpoint:  # a run directory
        found = latest_complete(path, warn) if resume else next(
            (path / sub for sub in ("best", "final") if (path / sub / "config.json").is_file()), None)
        if found is None:
            raise PiconeoxError(f"{flag}{path}: no complete step-XXXXXXXX checkpoint in this run directory" if resume
                                else f"{flag}{not_a_checkpoint(path)}")
        path = found
    if (path / MARKER).exists() or STEP_RE.match(path.name) or resume:
        reason = check_complete(path, verify=resume)
        if reason:
            raise PiconeoxError(f"{flag}{reason}")
    if reason := foreign_entry(path):  # a from_pretrained folder without a marker too
        raise PiconeoxError(f"{flag}{reason}")
    if resume and not (path / DCP_INDEX).exists():
        raise PiconeoxError(f"{flag}{path}: a weights-only checkpoint (best/); resume from a step-XXXXXXXX "
                            "or final/ folder, or load these weights with utils.generate / rp2040.export")
    if not resume and not ((path / WEIGHTS_FILE).is_file() or (path / DCP_INDEX).is_file()):
        raise PiconeoxError(f"{flag}{path} holds no model: expected config.json + {WEIGHTS_FILE}, or a run dir with "
                            "best/ or final/")
    return path
