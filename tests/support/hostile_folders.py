"""The one-off cases of test_hostile.py on checkpoint, model and dataset folders (the tables of marker names,
index paths and links are in hostile_checkpoints.py, whose builders these use): unlisted files and FIFOs, a planted
step link, links in a dataset or a tokenizer's folder, files past their size."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.support.hostile import case, oversize
from tests.support.hostile_checkpoints import (STEP, copy_final, copy_step, link_out, remark, secret, tool,
                                               train_argv)
from utils.ckpt.format import MARKER


@case("link-notes-consolidate", "notes.json is a symbolic link")
def _(work, outside, base):  # an unlisted file linked to a secret: was copied into --out
    folder = copy_step(work, base)
    (folder / "notes.json").symlink_to(secret(outside))
    return tool("consolidate", folder, work, base)


@case("consolidate-beside-input", "", code=0, leftovers=("out-hf",))
def _(work, outside, base):  # a loader once wrote (and first deleted) .<name>.weights.tmp beside its input
    folder = copy_step(work, base)
    (folder.with_name(f".{STEP}.weights.tmp")).mkdir()
    (folder.with_name(f".{STEP}.weights.tmp") / "keep.txt").write_text("the user's own folder")
    return tool("consolidate", folder, work, base)


@case("fifo-unlisted-evaluate", "notes.json is not a regular file")
def _(work, outside, base):
    folder = copy_step(work, base)
    os.mkfifo(folder / "notes.json")
    return tool("evaluate", folder, work, base)


@case("fifo-hf-tokenizer-config-generate", "tokenizer_config.json is not a regular file")
def _(work, outside, base):  # transformers opens every tokenizer file there is: a FIFO would block it
    folder = copy_final(work, base)
    (folder / "tokenizer_config.json").unlink()
    os.mkfifo(folder / "tokenizer_config.json")
    return tool("generate", folder, work, base)


@case("link-step-folders-resume-auto", "", code=0, leftovers=("*",),
      check=lambda work, outside: (assert_real_step(work / "ckpt" / "run" / "step-00000020"),
                                   assert_empty(outside / "trap")))
def _(work, outside, base):  # a planted step-N link: received the next checkpoint; a newer one was resumed from
    copy_step(work, base)
    (outside / "trap").mkdir(parents=True)
    shutil.copytree(base.step, outside / "step-00000030")
    (work / "ckpt" / "run" / "step-00000020").symlink_to(outside / "trap")
    (work / "ckpt" / "run" / "step-00000030").symlink_to(outside / "step-00000030")
    return train_argv(work, base, "--resume", "auto", "--max-steps", "20", "--save-every", "10")


def assert_real_step(folder: Path) -> None:
    from utils.ckpt.format import check_complete

    assert not folder.is_symlink() and check_complete(folder, verify=True) is None


def assert_empty(folder: Path) -> None:
    assert not any(folder.iterdir()), sorted(folder.iterdir())


for name in ("train_00000.npy", "manifest.json", "tokenizer.json"):
    @case(f"link-dataset-{name.split('.')[0]}-train", f"{name} is a symbolic link",
          leftovers=("data/.crc32c-index.json",))
    def _(work, outside, base, name=name):
        data = Path(shutil.copytree(base.data, work / "data"))
        link_out(data, name, outside)
        return train_argv(work, base, data=data)


@case("link-tokenizer-from", "tokenizer.json is a symbolic link")
def _(work, outside, base):
    folder = copy_final(work, base)
    (work / "data").mkdir()  # prepare_data leaves --out-dir behind when it creates it (not this issue's)
    link_out(folder, "tokenizer.json", outside)
    return "prepare_data", ["--name", "d", "--out-dir", str(work / "data"), "--tokenizer-from", str(folder)]


@case("link-export-from-pretrained", "tokenizer.json is a symbolic link")
def _(work, outside, base):
    folder = copy_final(work, base)
    link_out(folder, "tokenizer.json", outside)
    return tool("export", folder, work, base)


@case("marker-oversize-generate", "COMPLETE is unreadable")
def _(work, outside, base):
    folder = copy_step(work, base)
    oversize(folder / MARKER)
    return tool("generate", folder, work, base)


@case("tokenizer-config-oversize-consolidate", "allowed for this file")
def _(work, outside, base):
    folder = copy_step(work, base)
    oversize(folder / "tokenizer_config.json")
    remark(folder)
    return tool("consolidate", folder, work, base)
