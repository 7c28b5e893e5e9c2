"""The optimizers (AdamW, or Muon for the hidden matrices with AdamW for the rest) and the lr schedules.

Everything a run needs to know about an optimizer is asked here: `refusal` (the layouts it cannot train) and
`state_bytes` (its memory), so train.py and the plan (configs/plan.py) never restate either.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from utils.errors import PiconeoxError
from utils.lr_range import MAX_LR  # noqa: F401  (re-exported; torch-free for the preflight)
from utils.muon import BatchedMuon, closure_loss


STATE_BYTES_PER_PARAMETER = {"adamw": 8, "muon": 4}
"""fp32 state per parameter: AdamW's exp_avg and exp_avg_sq; Muon's momentum_buffer (its matrices only)."""


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (Linear/Embedding weights); never biases or LayerNorm parameters (all 1-D)."""
    decay, no_decay = [], []
    for p in model.parameters():  # parameters() yields a tied weight once
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def muon_matrices(model: torch.nn.Module) -> list[torch.Tensor]:
    """The 2-D weights inside the transformer layers (attention and MLP projections): what Muon takes. The
    embedding and the output head stay with AdamW (a lookup table and a classifier, not hidden maps: Keller
    Jordan's Muon recipe), as do biases and norms (1-D)."""
    outer = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
             for p in m.parameters()}
    return [p for p in model.parameters() if p.requires_grad and p.dim() == 2 and id(p) not in outer]


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon (`utils/muon.BatchedMuon`: torch.optim.Muon's math and state, batched by shape) on `muon_matrices`,
    fused AdamW on every other parameter, as ONE torch optimizer: one state dict (Muon's `momentum_buffer`,
    AdamW's `exp_avg`/`exp_avg_sq`/`step`, keyed by parameter), so the checkpoint's optimizer part saves and
    resumes both, and one LambdaLR scales both lrs. AdamW's groups come first (the lr a run reports is
    learning_rate's), Muon's last, with `muon: True`."""

    def __init__(self, model, lr: float, weight_decay: float, betas: tuple[float, float], muon_lr: float,
                 muon_momentum: float):
        matrices = muon_matrices(model)
        taken = {id(p) for p in matrices}
        rest = [g | {"params": [p for p in g["params"] if id(p) not in taken]}
                for g in param_groups(model, weight_decay)]
        # "match_rms_adamw" scales each matrix's step to AdamW's typical update size (0.2 sqrt(max dim)), so
        # muon_lr reads like an AdamW lr and carries across widths (Moonshot's Muon paper).
        self._muon = BatchedMuon(matrices, lr=muon_lr, weight_decay=weight_decay, momentum=muon_momentum,
                                 adjust_lr_fn="match_rms_adamw")
        self._adamw = torch.optim.AdamW([g for g in rest if g["params"]], lr=lr, betas=betas, fused=True)
        for g in self._muon.param_groups:
            g["muon"] = True
        for g in self._adamw.param_groups:
            g["muon"] = False
        super().__init__(self._adamw.param_groups + self._muon.param_groups, {})
        self._link()

    def _link(self):
        """Point both inner optimizers at this one's groups and state (load_state_dict replaces both)."""
        n = sum(not g["muon"] for g in self.param_groups)
        self._adamw.param_groups, self._muon.param_groups = self.param_groups[:n], self.param_groups[n:]
        self._muon.state = self._adamw.state = self.state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        self._muon.step()
        self._adamw.step()
        return loss


def refusal(kind: str, sharded: bool) -> str | None:
    """Why optimizer `kind` cannot train parameters laid out this way (sharded: FSDP2, each rank a shard of every
    matrix), as the one line a run and the plan print; None when it can."""
    if kind == "muon" and sharded:
        return ("train.optimizer=muon: not with FSDP2 (Muon orthogonalises whole matrices, each rank holds a "
                "shard); use optimizer adamw, or DDP")
    return None


def check_allowed(kind: str, sharded: bool) -> None:
    """Raise `refusal(kind, sharded)` as a PiconeoxError (one line, exit 2) when there is one."""
    if why := refusal(kind, sharded):
        raise PiconeoxError(why)


def state_bytes(model: torch.nn.Module, kind: str) -> int:
    """Bytes of optimizer state for all of `model`'s parameters, unsharded (shapes only: a meta-device model
    works): AdamW's 8 a parameter; for muon, 4 on `muon_matrices` and AdamW's 8 on the rest. The per-parameter
    step counters (one scalar each) are left out."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    muon = sum(p.numel() for p in muon_matrices(model)) if kind == "muon" else 0
    return STATE_BYTES_PER_PARAMETER["muon"] * muon + STATE_BYTES_PER_PARAMETER["adamw"] * (total - muon)


def build_optimizer(model, lr: float, weight_decay: float, betas: tuple[float, float], kind: str = "adamw",
                    muon_lr: float = 0.0, muon_momentum: float = 0.95, sharded: bool = False) -> torch.optim.Optimizer:
    """AdamW with the fused kernel (on CPU too, where PyTorch's default is a per-tensor loop, 3-4x slower), or
    `MuonWithAdamW` for kind "muon"; refused in one line where `refusal` says so."""
    check_allowed(kind, sharded)
    if kind == "muon":
        return MuonWithAdamW(model, lr, weight_decay, betas, muon_lr, muon_momentum)
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, fused=True)


def warmup_cosine(warmup_steps: int, max_steps: int, min_lr_ratio: float):
    """Multiplier of the base lr at optimizer step `s` (0-based): linear warmup, then cosine to the floor."""

    def factor(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        progress = min(1.0, (s - warmup_steps) / max(1, max_steps - warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def warmup_stable_decay(warmup_steps: int, max_steps: int, min_lr_ratio: float, decay_fraction: float):
    """Linear warmup, the peak lr held, then a linear decay to the floor over the last `decay_fraction` of the
    steps (WSD: the schedule of the modded-nanoGPT speedruns and MiniCPM)."""
    decay_start = max(warmup_steps, max_steps - round(decay_fraction * max_steps))

    def factor(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        if s < decay_start:
            return 1.0
        progress = min(1.0, (s - decay_start) / max(1, max_steps - decay_start))
        return 1.0 - (1.0 - min_lr_ratio) * progress

    return factor


def on_time(kind: str, step: int, progress: float, warmup_steps: int, min_lr_ratio: float,
            decay_fraction: float) -> float:
    """Multiplier of the base lr for a run with a time budget: linear warmup over the first `warmup_steps` optimizer
    steps, and after it a function of `progress`, the share of the training time done (0..1): wsd holds the peak
    until 1 - decay_fraction, then decays linearly to the floor at 1; cosine falls from the peak to the floor over
    the whole window. Where the two overlap (a budget too short for the warmup), the lower wins."""
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
    p = min(1.0, max(0.0, progress))
    if kind == "wsd":
        into_decay = (p - (1.0 - decay_fraction)) / decay_fraction
        after = 1.0 - (1.0 - min_lr_ratio) * min(1.0, max(0.0, into_decay))
    else:
        after = min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    return min(warm, after)


def build_scheduler(optimizer, warmup_steps: int, max_steps: int, min_lr_ratio: float, kind: str = "cosine",
                    decay_fraction: float = 0.2, progress: Callable[[], float] | None = None,
                    steps_too: bool = False):
    """A LambdaLR stepped by the trainer once per optimizer step (never per micro-step or per process). With
    `progress` (a time budget's share of the training time done, read at each step) the schedule follows the clock
    (`on_time`) and `max_steps` plays no part, unless `steps_too`: then the lower of the two schedules wins."""
    if kind == "wsd":
        by_step = warmup_stable_decay(warmup_steps, max_steps, min_lr_ratio, decay_fraction)
    else:
        by_step = warmup_cosine(warmup_steps, max_steps, min_lr_ratio)
    factor = by_step
    if progress is not None:
        def factor(s: int) -> float:  # a function, not an object: LambdaLR saves no state for it
            by_time = on_time(kind, s, progress(), warmup_steps, min_lr_ratio, decay_fraction)
            return min(by_time, by_step(s)) if steps_too else by_time
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def kept_rates(asked: list[float], restored: list[float]) -> str | None:
    """The line a resume logs when its command asks for other peak learning rates (the schedule's base rates, one
    per parameter group: AdamW's, and Muon's for its matrices) than the checkpoint's schedule holds: the restored
    optimizer and scheduler states win. None when they agree."""
    if [round(a, 12) for a in asked] == [round(r, 12) for r in restored]:
        return None

    def rates(values):
        return ", ".join(f"{v:g}" for v in dict.fromkeys(values))

    return (f"resume: the checkpoint's learning rate(s) {rates(restored)} continue, not the {rates(asked)} this "
            "command asks for (--lr, train.muon_lr): a resume keeps its optimizer and schedule; to train at the new "
            "rate, start a new run from its weights with --init-from checkpoints/<run>/final")
