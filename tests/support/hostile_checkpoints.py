"""How test_hostile.py builds its hostile checkpoints and datasets, and its table-driven checkpoint cases (marker
names, index storage paths, links): copies of one trained checkpoint and one dataset, changed the way an attacker
(or a damaged download) would, with the COMPLETE marker recomputed (anyone can). Each builder takes
(work, outside, base) and returns (module, argv). The one-off folder cases are in hostile_folders.py."""
from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.support.hostile import CASES, Case
from tests.support.training import TINY
from utils.ckpt.format import DCP_INDEX, manifest, read_marker, write_marker
from utils.crc import crc32c_file

STEP = "step-00000010"
SHARD = "__0_0.distcp"


@dataclass
class Base:
    """What every case copies from: a trained run (ckpt/run/{step-00000010,best,final}), its dataset, an exported
    Pico model and a GCS emulator bucket."""

    run: Path
    data: Path
    pico: Path
    gcs_bucket: str

    @property
    def step(self) -> Path:
        return self.run / "ckpt" / "run" / STEP


def copy_step(work: Path, base: Base, name: str = STEP) -> Path:
    """A copy of the run's step-00000010 under work/ckpt/run (or its final/, which --init-from takes, beside)."""
    folder = work / "ckpt" / "run" / name if name == STEP else work / "from" / name
    shutil.copytree(base.run / "ckpt" / "run" / name, folder)
    return folder


def copy_final(work: Path, base: Base) -> Path:
    """A from_pretrained folder (config.json + model.safetensors + tokenizer) without its marker."""
    folder = work / "hf"
    shutil.copytree(base.run / "ckpt" / "run" / "final", folder)
    for name in ("COMPLETE", ".metadata") + tuple(p.name for p in folder.glob("*.distcp")):
        (folder / name).unlink(missing_ok=True)
    return folder


def secret(outside: Path, name: str = "secret.txt", data: bytes = b"TOP SECRET: never read me\n") -> Path:
    outside.mkdir(parents=True, exist_ok=True)
    (outside / name).write_bytes(data)
    return outside / name


def remark(folder: Path, extra: dict[str, dict] | None = None) -> None:
    """Recompute the marker over the files it lists (now), plus `extra` raw entries: what anyone can do."""
    marker = read_marker(folder) or {"step": 10, "world_size": 1, "files": {}}
    names = [n for n in marker["files"] if (folder / n).is_file()]
    files = {**manifest(folder, names), **(extra or {})}
    write_marker(folder, marker["step"], marker["world_size"], files)


def entry(path: Path) -> dict:
    """A marker entry that matches `path` (so a loader that follows the name finds what it expects)."""
    return {"size": path.stat().st_size, "crc32c": crc32c_file(path)}


def link_out(folder: Path, name: str, outside: Path, relist: bool = True) -> Path:
    """Move `folder/name` outside and leave a symbolic link to it (same bytes: its crc32c still matches)."""
    target = outside / name
    outside.mkdir(parents=True, exist_ok=True)
    shutil.move(folder / name, target)
    (folder / name).symlink_to(target)
    return target


def edit_metadata(folder: Path, **changes) -> None:
    """Point the model's first weight in `.metadata` somewhere else (relative_path, offset, length)."""
    meta = pickle.loads((folder / DCP_INDEX).read_bytes())  # our own fixture's index: trusted
    index = next(i for i in meta.storage_data if i.fqn.startswith("model."))
    meta.storage_data[index] = dataclasses.replace(meta.storage_data[index], **changes)
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))
    remark(folder)


def relative(frm: Path, to: Path) -> str:
    return os.path.relpath(to, frm)


def train_argv(work: Path, base: Base, *extra: str, data: Path | None = None) -> tuple[str, list[str]]:
    return "train", [*TINY, "--data", str(data or base.data), "--output-dir", str(work / "ckpt"), "--log-dir",
                     str(work / "logs"), "--run-name", "run", "--max-steps", "12", *extra]


def tool(name: str, folder: Path, work: Path, base: Base) -> tuple[str, list[str]]:
    """A loader CLI reading the checkpoint `folder`, its output (if any) inside `work`."""
    text = work / "text.txt"
    if not text.exists():
        text.write_text("Once upon a time there was a test.\n")
    calls = {"consolidate": lambda: ("utils.consolidate", [str(folder), "--out", str(work / "out-hf")]),
             "generate": lambda: ("utils.generate", [str(folder), "--max-new-tokens", "2"]),
             "evaluate": lambda: ("utils.evaluate", [str(folder), "--eval-perplexity", str(text)]),
             "to_gguf": lambda: ("utils.to_gguf", [str(folder), "--out", str(work / "m.gguf")]),
             "export": lambda: ("rp2040.export", [str(folder), "--out", str(work / "pico")]),
             "resume": lambda: train_argv(work, base, "--resume", str(folder)),
             "resume-auto": lambda: train_argv(work, base, "--resume", "auto"),
             "init-from": lambda: train_argv(work, base, "--init-from", str(folder))}
    return calls[name]()


# --- the cases -------------------------------------------------------------------------------------------------
# Marker names: every loader stats and hashes what COMPLETE lists; each name below is listed
# with the size and crc32c of the secret outside, so a loader that follows it finds what it expects.
MARKER_NAMES = {  # id: (name given the folder and the secret, loader, expected)
    "dotdot": (lambda f, s: relative(f, s), "consolidate", "'..' segment"),
    "absolute": (lambda f, s: str(s), "generate", "it is absolute"),
    "newline": (lambda f, s: "x\nerror: a forged second line", "resume", "control character"),
    "escape": (lambda f, s: "\x1b[2J\x1b[Hsecret", "to_gguf", "control character"),
    "slash": (lambda f, s: "sub/secret.txt", "evaluate", "without '/'"),
    "empty": (lambda f, s: "", "consolidate", "it is empty"),
    "dot": (lambda f, s: ".", "export", "'..' segment"),
    "backslash": (lambda f, s: "..\\secret.txt", "generate", "backslash"),
    "nul": (lambda f, s: "a\x00b", "resume", "control character"),
    "dotdot-auto": (lambda f, s: relative(f, s), "resume-auto", "'..' segment"),
    "dotdot-init": (lambda f, s: relative(f, s), "init-from", "'..' segment"),
}


def marker_name(name_of, loader):
    def build(work, outside, base):
        folder = copy_step(work, base, "final" if loader == "init-from" else STEP)
        s = secret(outside)
        if name_of(folder, s).startswith("sub/"):
            (folder / "sub").mkdir()
            shutil.copy(s, folder / "sub" / "secret.txt")
        remark(folder, {name_of(folder, s): entry(s)})
        return tool(loader, folder, work, base)
    return build


def shard_copy(folder: Path, outside: Path) -> Path:
    outside.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(folder / SHARD, outside / SHARD))


def fifo(path: Path) -> None:
    os.mkfifo(path)


# .metadata storage paths: the model's first weight read from elsewhere.
METADATA = {  # id: (changes given folder and outside, loader, expected)
    "outside": (lambda f, o: {"relative_path": relative(f, shard_copy(f, o))}, "consolidate", "refused to load"),
    "absolute": (lambda f, o: {"relative_path": str(shard_copy(f, o))}, "generate", "refused to load"),
    "dev-zero": (lambda f, o: {"relative_path": "/dev/zero"}, "resume", "refused to load"),
    "fifo": (lambda f, o: (fifo(f / "pipe.distcp"), {"relative_path": "pipe.distcp"})[1], "consolidate",
             "pipe.distcp is not a regular file"),
    "unlisted": (lambda f, o: (shutil.copy(f / SHARD, f / "extra.distcp"), {"relative_path": "extra.distcp"})[1],
                 "generate", "marker does not list"),
    "not-a-string": (lambda f, o: {"relative_path": 5}, "to_gguf", "it is not a string"),
    "beyond-the-end": (lambda f, o: {"offset": (f / SHARD).stat().st_size + 10}, "evaluate",
                       "not a readable checkpoint index"),
    "negative-offset": (lambda f, o: {"offset": -1}, "export", "not a readable checkpoint index"),
    "huge-length": (lambda f, o: {"length": 2 ** 40}, "consolidate", "not a readable checkpoint index"),
    "the-marker": (lambda f, o: {"relative_path": "COMPLETE"}, "resume-auto", "marker does not list"),
    "newline": (lambda f, o: {"relative_path": "x\nerror: forged"}, "resume", "control character"),
    "sibling": (lambda f, o: (shutil.copytree(f, f.with_name("step-00000005")),
                              {"relative_path": f"../step-00000005/{SHARD}"})[1], "generate", "'..' segment"),
}


def metadata(changes_of, loader):
    def build(work, outside, base):
        folder = copy_step(work, base)
        secret(outside)
        edit_metadata(folder, **changes_of(folder, outside))
        return tool(loader, folder, work, base)
    return build


# Links in checkpoint folders: each file moved outside with a link left in its place.
LINKS = {  # id: (file, loader, folder kind)
    "shard-resume": (SHARD, "resume", "step"),
    "tokenizer-generate": ("tokenizer.json", "generate", "step"),
    "config-to-gguf": ("config.json", "to_gguf", "step"),
    "marker-evaluate": ("COMPLETE", "evaluate", "step"),
    "index-export": (".metadata", "export", "step"),
    "rng-resume-auto": ("rng-00000.json", "resume-auto", "step"),
    "weights-generate": ("model.safetensors", "generate", "hf"),
    "tokenizer-init-from": ("tokenizer.json", "init-from", "hf"),
    "config-evaluate": ("config.json", "evaluate", "hf"),
}


def linked(name, loader, kind):
    def build(work, outside, base):
        folder = copy_step(work, base) if kind == "step" else copy_final(work, base)
        link_out(folder, name, outside)
        return tool(loader, folder, work, base)
    return build


SKIPPED = dict(code=0, leftovers=("*",))  # `--resume auto` passes over a refused step folder (one warning) and
# starts from the newest one it trusts: here none, so it starts fresh
for key, (name_of, loader, message) in MARKER_NAMES.items():
    CASES.append(Case(f"marker-{key}-{loader}", marker_name(name_of, loader), message,
                      **(SKIPPED if loader == "resume-auto" else {})))
for key, (changes_of, loader, message) in METADATA.items():
    CASES.append(Case(f"metadata-{key}-{loader}", metadata(changes_of, loader), message))
for key, (name, loader, kind) in LINKS.items():
    CASES.append(Case(f"link-{key}", linked(name, loader, kind), "is a symbolic link",
                      **(SKIPPED if loader == "resume-auto" else {})))
