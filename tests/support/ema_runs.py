"""Runs with the EMA of the weights, and how two runs' tensors and histories are compared."""
import shutil

import torch

from utils.ckpt.format import step_dir_name

EMA = ("--set", "train.ema_decay=0.9", "--set", "train.best_final_weights=ema")


def assert_same_tensors(a: dict, b: dict) -> None:
    differ = [k for k in a if k not in b or not torch.equal(a[k], b[k])]
    assert a.keys() == b.keys() and not differ, differ


def cut_from(ref, cut, step: int) -> None:
    """`cut` as if `ref`'s run had been stopped right after its checkpoint of `step` (same schedule, same history)."""
    shutil.copytree(ref / "ckpt" / "run" / step_dir_name(step), cut / "ckpt" / "run" / step_dir_name(step))
    shutil.copytree(ref / "logs", cut / "logs")  # the history the resumed run continues
