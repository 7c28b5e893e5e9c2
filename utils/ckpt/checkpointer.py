"""One registry of the training's stateful parts, used for save and for load.

    parts = training_parts(scheduler, accelerator.scaler, train_loader, trainer_state, metrics)
    checkpointer = Checkpointer(model, optimizer, parts, run_config=run_config, tokenizer=tokenizer)
    snapshot = checkpointer.capture(step)       # this rank's state off the device; write it on the saver thread
    checkpointer.load(folder)                   # every part back in place, this rank's shards through DCP

The model and optimizer go into DCP shards (each rank its own); every other part is one file written by rank 0
(`<name>.json`: small states are never pickles). Adding a piece of checkpointed state (EMA weights, say) is one
entry in `training_parts`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

from utils.ckpt.load import load_sharded, read_part, read_rng
from utils.ckpt.state import Snapshot, full_weights, rng_state, set_rng_state, staged_share
from utils.errors import PiconeoxError


@dataclass
class TrainerState:
    """The loop's own progress; saved in every checkpoint as trainer.json."""

    step: int = 0
    tokens_seen: int = 0
    best_val_loss: float = math.inf
    evals_without_improvement: int = 0
    train_seconds: float = 0.0

    def state_dict(self) -> dict:
        d = asdict(self)
        d["best_val_loss"] = None if math.isinf(self.best_val_loss) else self.best_val_loss  # JSON has no inf
        return d

    def load_state_dict(self, d: dict) -> None:
        for k, v in d.items():
            setattr(self, k, math.inf if (k == "best_val_loss" and v is None) else v)


@dataclass
class Part:
    """One piece of checkpointed state: anything with state_dict() / load_state_dict(); None is skipped.

    suffix: "json", the only kind of small state (a loaded checkpoint builds no objects from it).
    in_best: whether weights-only checkpoints (best/) carry it too.
    required: whether a resume refuses a checkpoint without it (the fp16 scaler exists only in fp16 runs).
    """

    obj: object
    suffix: str = "json"
    in_best: bool = True
    required: bool = True


def training_parts(scheduler, scaler, loader, trainer: TrainerState, metrics) -> dict[str, Part]:
    """The registry of everything a resume needs besides model and optimizer: one entry per part."""
    return {"scheduler": Part(scheduler, in_best=False), "scaler": Part(scaler, in_best=False, required=False),
            "loader": Part(loader), "trainer": Part(trainer), "metrics": Part(metrics)}


class Checkpointer:
    """Captures and loads one rank's training state: model and optimizer (sharded) plus the registered parts.

    `model` is the unwrapped model (plain, DDP's module, or FSDP2-sharded) and `optimizer` the torch optimizer.
    run_config (the resolved settings) and the tokenizer travel with every checkpoint and are never loaded back.
    """

    def __init__(self, model, optimizer, parts: dict[str, Part], *, run_config: dict, tokenizer, rank: int = 0,
                 world_size: int = 1):
        self.model, self.optimizer, self.parts = model, optimizer, parts
        self.run_config, self.tokenizer, self.rank, self.world_size = run_config, tokenizer, rank, world_size

    def capture(self, step: int, weights_only: bool = False) -> Snapshot:
        """Copy this rank's part of the state off the device; the training loop may continue right after.

        Every rank must call this at the same point (FSDP's state-dict calls are collectives). `weights_only`
        (best/) gathers the full weights onto rank 0 instead of sharding model and optimizer.
        """
        common = {name: (part.suffix, part.obj.state_dict()) for name, part in self.parts.items()
                  if part.obj is not None and (part.in_best or not weights_only)}
        common["run_config"] = ("json", self.run_config)
        return Snapshot(
            step=step, rank=self.rank, world_size=self.world_size,
            state=None if weights_only else staged_share(self.model, self.optimizer, self.rank, self.world_size),
            weights=full_weights(self.model) if weights_only else None,
            rng=rng_state(), common=common, hf_config=self.model.config, tokenizer=self.tokenizer)

    def load(self, folder: Path) -> None:
        """Put every part back as `folder` holds it; every rank must call this (the sharded load is a collective)."""
        load_sharded(folder, self.model, self.optimizer)
        for name, part in self.parts.items():
            state = read_part(folder, name, like=part.obj.state_dict() if part.obj is not None else None)
            if state is None and part.required and part.obj is not None:
                raise PiconeoxError(f"{folder}: the checkpoint has no {name} state; it cannot be resumed exactly")
            if state is not None and part.obj is not None:
                part.obj.load_state_dict(state)
        set_rng_state(read_rng(folder, self.rank))
