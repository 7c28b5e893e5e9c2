"""Records of the wrong type, dtype or shape in a step folder, each within every bound of the reader: the cases of
tests/hostile/test_typed_loads.py. Each builder copies the trained run's step folder (hostile_checkpoints), points
one record of its index at other bytes or changes what the index says of it, recomputes the marker, and returns the
loader CLI reading it."""
from __future__ import annotations

import dataclasses
import pickle
import shutil
from pathlib import Path

import torch

from tests.support.hostile import Case
from tests.support.hostile_checkpoints import copy_final, copy_step, remark, tool
from tests.support.payloads import torch_bytes
from utils.ckpt.format import DCP_INDEX

WEIGHT = "model.gpt_neox.embed_in.weight"  # [256, 32] float32 in the trained run
STATE = "optim.state.gpt_neox.embed_in.weight"
GROUP = "optim.param_groups.0"


def nested_tuples() -> tuple:
    """~370 KB pickled: 4,000 tuples of 30 ints under one tuple, within every bound of the reader."""
    return tuple(tuple(range(1000 + i % 200, 1030 + i % 200)) for i in range(4_000))


def edit_index(folder: Path, change) -> None:
    """`change(meta)` on the folder's own (trusted) index, written back."""
    meta = pickle.loads((folder / DCP_INDEX).read_bytes())
    change(meta)
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))


def replace_record(folder: Path, key: str, data: bytes) -> None:
    """Point the index's record of `key` at `data`, appended to its .distcp file."""
    def change(meta):
        index = next(i for i in meta.storage_data if i.fqn == key)
        path = folder / meta.storage_data[index].relative_path
        meta.storage_data[index] = dataclasses.replace(meta.storage_data[index], offset=path.stat().st_size,
                                                       length=len(data))
        with open(path, "ab") as f:
            f.write(data)
    edit_index(folder, change)


def retype(key: str, dtype: torch.dtype):
    """An index change: `key` listed as a tensor of `dtype`."""
    def change(meta):
        entry = meta.state_dict_metadata[key]
        entry.properties = dataclasses.replace(entry.properties, dtype=dtype)
    return change


def as_value(key: str):
    """An index change: the tensor `key` listed as a pickled value."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    def change(meta):
        meta.state_dict_metadata[key] = BytesStorageMetadata()
    return change


def record(key: str, value, index_change=None):
    """A builder's change to a step folder: the record of `key` holds `value` (torch.save'd), the index changed by
    `index_change` (or not)."""
    def apply(folder: Path) -> None:
        replace_record(folder, key, torch_bytes(value))
        if index_change:
            edit_index(folder, index_change)
    return apply


def index_only(change):
    return lambda folder: edit_index(folder, change)


def built(apply, loader: str):
    def build(work, outside, base):
        if loader == "init-from":  # a step folder (DCP) outside the new run's own folder
            folder = Path(shutil.copytree(base.step, work / "from" / base.step.name))
        else:
            folder = copy_step(work, base)
        apply(folder)
        remark(folder)
        return tool(loader, folder, work, base)
    return build


INT_WEIGHT = record(WEIGHT, torch.zeros(256, 32, dtype=torch.int64), retype(WEIGHT, torch.int64))  # index too
TUPLE_WEIGHT = f"record {WEIGHT} holds a tuple where a float32 tensor of shape [256, 32] belongs"
CASES = {  # id: (change to the step folder, loader, the line's words)
    "lr-tuple-resume": (record(f"{GROUP}.lr", nested_tuples()), "resume",
                        f"record {GROUP}.lr holds a tuple where a number belongs"),
    **{f"weight-tuple-{loader}": (record(WEIGHT, nested_tuples()), loader, TUPLE_WEIGHT)
       for loader in ("consolidate", "generate", "evaluate", "to_gguf", "export", "resume", "init-from")},
    "weight-float64-consolidate": (record(WEIGHT, torch.zeros(256, 32, dtype=torch.float64)), "consolidate",
                                   f"{WEIGHT} holds a float64 tensor of shape [256, 32] where a float32"),
    "weight-shape-generate": (record(WEIGHT, torch.zeros(255, 32)), "generate",
                              f"{WEIGHT} holds a float32 tensor of shape [255, 32] where a float32 tensor of shape "
                              "[256, 32] belongs"),
    "weight-int64-everywhere-export": (INT_WEIGHT, "export",
                                       "not the model's: gpt_neox.embed_in.weight: a int64 tensor"),
    "weight-int64-everywhere-resume": (INT_WEIGHT, "resume",
                                       f"{WEIGHT} is listed as a int64 tensor where a float32 tensor"),
    "weight-as-value-resume": (index_only(as_value(WEIGHT)), "resume", f"{WEIGHT} is listed as a pickled value"),
    "weight-as-value-consolidate": (index_only(as_value(WEIGHT)), "consolidate",
                                    "describes gpt_neox.embed_in.weight as [256, 32], the weights hold none"),
    "exp-avg-tuple-resume": (record(f"{STATE}.exp_avg", nested_tuples()), "resume",
                             f"record {STATE}.exp_avg holds a tuple where a float32 tensor of shape [256, 32]"),
    "step-int-resume": (record(f"{STATE}.step", 10), "resume",
                        f"record {STATE}.step holds a int where a float32 tensor of shape []"),
    "betas-strings-resume": (record(f"{GROUP}.betas", ("0.9", "0.95")), "resume",
                             f"record {GROUP}.betas [0] holds a str where a number belongs"),
    "betas-three-resume": (record(f"{GROUP}.betas", (0.9, 0.95, 0.99)), "resume",
                           f"record {GROUP}.betas holds a tuple of 3 where a tuple of 2 belongs"),
    "lr-nan-resume": (record(f"{GROUP}.lr", float("nan")), "resume", f"record {GROUP}.lr holds nan where a finite"),
    "lr-huge-resume": (record(f"{GROUP}.lr", 1e6), "resume",
                       f"{GROUP}.lr 1000000.0 is not a learning rate (finite, 0..10)"),
    "eps-tensor-resume": (record(f"{GROUP}.eps", torch.ones(3)), "resume",
                          f"record {GROUP}.eps holds a float32 tensor of shape [3] where a number belongs"),
    "flag-string-resume": (record(f"{GROUP}.amsgrad", "yes"), "resume",
                           f"record {GROUP}.amsgrad holds a str where a flag belongs"),
    "params-others-resume": (record(f"{GROUP}.params", ["lm_head.weight"]), "resume",
                             f"record {GROUP}.params lists the parameters ['lm_head.weight'] where the model's"),
}

DENSE = "gpt_neox.layers.0.attention.dense.weight"  # [32, 32] float32


def hf_folder(change, loader: str):
    """A from_pretrained folder (the run's final/ without its marker) whose weights `change(state)` edited: saved
    back as model.safetensors, or as pytorch_model.bin when `change` returns "bin"."""
    def build(work, outside, base):
        from safetensors.torch import load_file, save_file

        folder = copy_final(work, base)
        state = load_file(folder / "model.safetensors")
        if change(state) == "bin":
            (folder / "model.safetensors").unlink()
            torch.save(state, folder / "pytorch_model.bin")
        else:
            save_file(state, folder / "model.safetensors")
        return tool(loader, folder, work, base)
    return build


HF_CASES = {  # id: (change to the weights, loader, the line's words)
    "hf-int64-generate": (lambda w: w.update({DENSE: w[DENSE].to(torch.int64)}), "generate",
                          f"model.safetensors: {DENSE} is a I64 tensor; model weights are floating point"),
    "hf-shape-init-from": (lambda w: w.update({DENSE: w[DENSE][:, :16].contiguous()}), "init-from",
                           f"config.json describes {DENSE} as [32, 32], the weights hold [32, 16]"),
    "hf-bin-tuple-init-from": (lambda w: (w.update({DENSE: nested_tuples()[:3]}), "bin")[1], "init-from",
                            f"pytorch_model.bin: {DENSE} holds a tuple; model weights are floating-point tensors"),
}

TYPED_CASES = [Case(f"typed-{key}", built(apply, loader), words, leftovers=("logs*", "ckpt/.locks*"))
               for key, (apply, loader, words) in CASES.items()] + \
              [Case(f"typed-{key}", hf_folder(change, loader), words, leftovers=("logs*", "ckpt*"))
               for key, (change, loader, words) in HF_CASES.items()]
