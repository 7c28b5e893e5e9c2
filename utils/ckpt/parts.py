"""The registry of a run's stateful parts, used for save and for load (the checkpoint room's bookkeeping).

    parts = training_parts(scheduler=scheduler, scaler=accelerator.scaler, loader=train_loader,
                           trainer=trainer_state, metrics=metrics, ema=ema)
    registry = Registry(model, optimizer, parts, run_config=run_config, tokenizer=tokenizer)
    snapshot = registry.capture(step)        # this rank's state off the device; write it on the saver thread
    registry.load(folder)                    # every part back in place, this rank's shards through DCP

A part is anything with state_dict() / load_state_dict(); `None` is skipped. Its contract:
- state_dict() returns a host copy taken when it is called (at save time), never a live reference: the saver
  thread writes it while the training goes on changing the original. (Small parts we do not own, such as
  LambdaLR, share lists with themselves: `capture` deep-copies small states, which costs nothing.)
- a part is small or sharded. Small: plain values or a few tensors, the same on every rank; rank 0 writes it as
  `<name>.json` (never a pickle). Sharded: `{name: tensor}` as this rank holds it (DTensor shards with
  the parameters' placement under FSDP2, whole tensors under DDP); it goes into DCP next to the model and the
  optimizer (keys `<part>.<name>`), every rank writes its share, and a resume on any world size reshards it.
  A sharded part whose tensors are weights (EMA) may be what best/ and final/ publish: it then also has
  full_state_dict(), the unsharded tensors on rank 0's CPU (a collective under FSDP2).
Adding a piece of checkpointed state is one entry in `training_parts`.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from utils.ckpt.load import load_sharded, read_part, read_rng
from utils.ckpt.state import Snapshot, full_weights, own_share, rng_state, set_rng_state, staged_share
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
    """One piece of checkpointed state (see the module docstring for the contract).

    in_best: whether weights-only checkpoints (best/) carry it too (small parts only).
    required: whether a resume refuses a checkpoint without it (the fp16 scaler exists only in fp16 runs).
    sharded: written into DCP by every rank instead of one file by rank 0.
    """

    obj: object
    in_best: bool = True
    required: bool = True
    sharded: bool = False


def training_parts(*, scheduler, scaler, loader, trainer: TrainerState, metrics, ema=None,
                   budget=None) -> dict[str, Part]:
    """The registry of everything a resume needs besides model and optimizer: one entry per part, each named by
    its keyword (None: the run has no such part, e.g. the scaler outside fp16; `budget`, a time budget's clock: the
    seconds spent and the schedule's progress, only in budgeted runs)."""
    return {"scheduler": Part(scheduler, in_best=False), "scaler": Part(scaler, in_best=False, required=False),
            "loader": Part(loader), "trainer": Part(trainer), "metrics": Part(metrics),
            "ema": Part(ema, sharded=True), "budget": Part(budget, in_best=False, required=False)}


def dcp_keys(folder: Path) -> set[str]:
    """The flattened keys of a step folder's DCP index (`model.x`, `optim.state.x.exp_avg`, `ema.x`, ...)."""
    from utils.ckpt.untrusted.safe_load import SafeFileSystemReader

    return set(SafeFileSystemReader(str(folder)).read_metadata().state_dict_metadata)


class Registry:
    """Captures and loads one rank's training state: model and optimizer (sharded) plus the registered parts.

    `model` is the unwrapped model (plain, DDP's module, or FSDP2-sharded) and `optimizer` the torch optimizer.
    run_config (the resolved settings) and the tokenizer travel with every checkpoint and are never loaded back.
    published: the sharded part whose full_state_dict() best/ holds instead of the model's weights (None: the model).
    """

    def __init__(self, model, optimizer, parts: dict[str, Part], *, run_config: dict, tokenizer, rank: int = 0,
                 world_size: int = 1, published: str | None = None):
        self.model, self.optimizer, self.run_config, self.tokenizer = model, optimizer, run_config, tokenizer
        self.parts = parts
        self.rank, self.world_size, self.published = rank, world_size, published

    def capture(self, step: int, weights_only: bool = False) -> Snapshot:
        """Copy this rank's part of the state off the device; the training loop may continue right after.

        Every rank must call this at the same point (FSDP's state-dict calls are collectives). `weights_only`
        (best/) gathers the full weights onto rank 0 instead of sharding model, optimizer and sharded parts.
        """
        live = {name: part for name, part in self.parts.items() if part.obj is not None}
        common = {name: ("json", copy.deepcopy(part.obj.state_dict())) for name, part in live.items()
                  if not part.sharded and (part.in_best or not weights_only)}
        common["run_config"] = ("json", self.run_config)
        state = weights = None
        if weights_only:
            weights = full_weights(self.model)
            if self.published:
                weights.update(self.parts[self.published].obj.full_state_dict())  # rank 0 holds them, others {}
        else:
            state = staged_share(self.model, self.optimizer, self.rank, self.world_size)
            for name, part in live.items():
                if part.sharded and (share := own_share(part.obj.state_dict(), self.rank, self.world_size)):
                    state[name] = share
        return Snapshot(step=step, rank=self.rank, world_size=self.world_size, state=state, weights=weights,
                        rng=rng_state(), common=common, hf_config=self.model.config, tokenizer=self.tokenizer)

    def load(self, folder: Path) -> None:
        """Put every part back as `folder` holds it; every rank must call this (the sharded load is a collective).
        A small part's file is read (through the allowlist) even when this run has no such part: a checkpoint
        with a refused file is refused whole."""
        from utils.distributed import all_gather_object

        states, rng, error = {}, None, None
        try:  # every small file checked before anything large is loaded
            states, rng = self.read_parts(folder), read_rng(folder, self.rank)
        except PiconeoxError as e:  # every rank learns it before the sharded load: none waits there for a rank gone
            error = f"rank {self.rank}: {e}" if self.world_size > 1 else str(e)
        if errors := [e for e in all_gather_object(error) if e]:
            raise PiconeoxError(errors[0])
        load_sharded(folder, self.model, self.optimizer)
        self.load_sharded_parts(folder)
        for name, state in states.items():
            self.parts[name].obj.load_state_dict(state)
        set_rng_state(rng)

    def read_parts(self, folder: Path) -> dict:
        """{name: saved state} of the small parts this run has, each shaped like the part's own state_dict() and
        holding the numbers a run writes at the marker's step (utils/ckpt/ranges.py); else one line."""
        from utils.ckpt.format import read_marker
        from utils.ckpt.ranges import part_problem

        step = read_marker(folder)["step"]
        states = {}
        for name, part in self.parts.items():
            like = part.obj.state_dict() if part.obj is not None else None  # the saved state must match its shape
            state = None if part.sharded else read_part(folder, name, like=like)
            if state is None and part.required and not part.sharded and part.obj is not None:
                raise PiconeoxError(f"{folder}: the checkpoint has no {name} state; it cannot be resumed exactly")
            if state is not None and (why := part_problem(name, state, step)):
                raise PiconeoxError(f"{folder}/{name}.json: not a {name} state a run writes: {why}")
            if state is not None and part.obj is not None:
                states[name] = state
        return states

    def load_sharded_parts(self, folder: Path) -> None:
        """Every sharded part from DCP: each rank reads the slices of its own shards into a host copy."""
        import torch.distributed as dist

        from utils.ckpt.untrusted.safe_load import load_dcp

        sharded = {name: part for name, part in self.parts.items() if part.sharded and part.obj is not None}
        if not sharded:
            return
        saved = {key.split(".", 1)[0] for key in dcp_keys(folder)}
        for name in sharded:
            if name not in saved:
                raise PiconeoxError(f"{folder}: the checkpoint has no {name} state (it was trained without it); "
                                    "it cannot be resumed exactly: resume without it or start a new run")
        state = {name: part.obj.state_dict() for name, part in sharded.items()}
        try:
            load_dcp(state, folder, no_dist=not dist.is_initialized())
        except PiconeoxError:
            raise
        except Exception as e:  # one line for the user, as load_sharded says it
            raise PiconeoxError(f"{folder}: cannot load {', '.join(sharded)}: {str(e).splitlines()[0][:300]}") from e
        for name, part in sharded.items():
            part.obj.load_state_dict(state[name])
