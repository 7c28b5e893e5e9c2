"""The numbers of a checkpoint's small parts, checked against what a run writes before any of them is obeyed.

A run writes: trainer.json step = the COMPLETE marker's step, tokens_seen = step x the run_config's
train.global_batch_tokens; scheduler.json last_epoch = that step and _step_count = step + 1 (the trainer steps the
scheduler once per optimizer step), learning rates finite and in 0..MAX_LR; loader.json non-negative whole
numbers; metrics.json history steps 0..step (a diverged run's loss may be NaN: any number or null there).
A file that says otherwise (`last_epoch: -1e8` trains at lr -1e4, `step: -1000` writes a folder `step--0000968`,
`global_batch_tokens: 1e9` makes a million micro-batches a step) is refused in one line naming the file and value.
"""
from __future__ import annotations

import math

from utils.lr_range import MAX_LR  # the range a run's settings are checked against too
MAX_TOKENS_PER_STEP = 1 << 40


def whole(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def finite(value, low: float, high: float) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and low <= value <= high


def _trainer(state: dict, step: int) -> str | None:
    if state.get("step") != step or type(state.get("step")) is not int:
        return f"step {state.get('step')!r}, but the COMPLETE marker says step {step}"
    for key in ("tokens_seen", "evals_without_improvement"):
        if not whole(state.get(key), 0, MAX_TOKENS_PER_STEP * max(step, 1)):
            return f"{key} {state.get(key)!r} is not a whole number >= 0"
    if not finite(state.get("train_seconds"), 0, math.inf):
        return f"train_seconds {state.get('train_seconds')!r} is not a finite number >= 0"
    best = state.get("best_val_loss")
    if best is not None and not finite(best, 0, math.inf):
        return f"best_val_loss {best!r} is not null or a finite number >= 0"
    return None


def _scheduler(state: dict, step: int) -> str | None:
    if not whole(state.get("last_epoch"), step, step):
        return f"last_epoch {state.get('last_epoch')!r}, but the checkpoint is at step {step}"
    if not whole(state.get("_step_count"), step + 1, step + 1):
        return f"_step_count {state.get('_step_count')!r}, but the checkpoint is at step {step} (expected {step + 1})"
    for key in ("base_lrs", "_last_lr"):
        values = state.get(key)
        if not isinstance(values, list) or not all(finite(v, 0, MAX_LR) for v in values):
            return f"{key} {str(values)[:80]} are not learning rates (finite, 0..{MAX_LR:g})"
    return None


def _loader(state: dict, step: int) -> str | None:
    for key in ("epoch", "blocks_consumed", "seed"):
        if not whole(state.get(key), 0, 2**63 - 1):
            return f"{key} {state.get(key)!r} is not a whole number >= 0"
    if not whole(state.get("seq_len"), 1, 2**31):
        return f"seq_len {state.get('seq_len')!r} is not a whole number >= 1"
    return None


def _metrics(state: dict, step: int) -> str | None:
    history = state.get("history")
    if not isinstance(history, list) or len(history) > 4 * (step + 1):
        return f"history must be a list of a few entries per step (at most {4 * (step + 1)})"
    for entry in history:
        if not isinstance(entry, dict) or not whole(entry.get("step"), 0, step):
            return f"a history entry's step {str(entry)[:60]} is not a step 0..{step}"
        if odd := next((k for k, v in entry.items() if v is not None and type(v) not in (int, float)), None):
            return f"history at step {entry['step']}: {odd} {str(entry[odd])[:40]!r} is not a number"
    return None


def optimizer_problem(state: dict) -> str | None:
    """Why the optimizer state a resume loaded (DCP's flattened names: optim.param_groups.N.lr) holds a learning
    rate a run never writes, or None. Its kinds of values are checked as it loads (utils/ckpt/untrusted/typed.py)."""
    for i, group in enumerate(state.get("param_groups", [])):
        for key in ("lr", "initial_lr"):
            if key in group and not finite(group[key], 0, MAX_LR):
                return f"optim.param_groups.{i}.{key} {group[key]!r} is not a learning rate (finite, 0..{MAX_LR:g})"
    return None


def _budget(state: dict, step: int) -> str | None:
    if not finite(state.get("spent_s"), 0, math.inf):
        return f"spent_s {state.get('spent_s')!r} is not a finite number of seconds >= 0"
    if not finite(state.get("progress"), 0, 1):
        return f"progress {state.get('progress')!r} is not a number in 0..1"
    return None


CHECKS = {"trainer": _trainer, "scheduler": _scheduler, "loader": _loader, "metrics": _metrics, "budget": _budget}


def part_problem(name: str, state: dict, step: int) -> str | None:
    """Why part `name`'s saved `state` (already shaped like the run's own) is not what a run writes at `step`."""
    check = CHECKS.get(name)
    return check(state, step) if check else None


def batch_problem(saved: dict, trainer: dict | None) -> str | None:
    """Why run_config.json's train.global_batch_tokens is not the batch the checkpoint trained with (trainer.json's
    tokens per step), or None. Older checkpoints without it: None (the trainer's numbers are checked on load)."""
    tokens = saved["train"].get("global_batch_tokens")
    if tokens is None or tokens == 0:
        return None
    if not whole(tokens, 1, MAX_TOKENS_PER_STEP):
        return f"train.global_batch_tokens {tokens!r} is not a whole number of tokens 1..{MAX_TOKENS_PER_STEP:,}"
    if trainer and whole(trainer.get("step"), 1, 2**63) and trainer.get("tokens_seen") != tokens * trainer["step"]:
        return (f"train.global_batch_tokens {tokens:,}, but trainer.json saw {trainer.get('tokens_seen')!r} tokens in "
                f"{trainer['step']} steps")
    return None
