"""An exponential moving average of the weights (`--set train.ema_decay=0.999`), a sharded checkpoint part.

    ema = WeightEMA(unwrapped_model, decay)   # after accelerator.prepare(): it mirrors the parameters' placement
    ema.update()                              # after each optimizer step: ema += (1 - decay) * (param - ema)
    with ema.swapped_in(): evaluate(...)      # the model runs with the averaged weights, then gets its own back

Each rank keeps the average of what it holds: its DTensor shards under FSDP2 (the copies keep the parameters'
placement, so DCP writes and reshards them like the model), whole tensors under DDP. Float32 like the
parameters: 4 bytes a parameter per rank (divided by the ranks under FSDP2). Tied parameters (the Pico
presets' embeddings) are averaged once and saved under each name, so a consolidated checkpoint has them all.
"""
from __future__ import annotations

import contextlib

import torch


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard, else the tensor itself (no copy)."""
    return getattr(t, "_local_tensor", t)


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of `t`; a DTensor stays a DTensor (same mesh and placements) around a CPU copy of its shard."""
    local = _local(t).detach().to("cpu", copy=True)
    if not hasattr(t, "_local_tensor"):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())


class WeightEMA:
    """The average of `model`'s parameters; a sharded part (utils/ckpt/parts.py) with state_dict()/load_state_dict()."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay, self.model = decay, model
        shadow: dict[int, torch.Tensor] = {}  # one average per parameter object: tied names share it
        self.names: dict[str, torch.Tensor] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) not in shadow:
                shadow[id(p)] = p.detach().clone()
            self.names[name] = shadow[id(p)]
        self.pairs = [(shadow[id(p)], p) for p in model.parameters()]

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the current weights (local shards only: no communication)."""
        averages = [_local(e) for e, _ in self.pairs]
        torch._foreach_lerp_(averages, [_local(p.detach()) for _, p in self.pairs], 1.0 - self.decay)

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_in(self):
        """The model holds the averaged weights inside the block and its own again after (each rank its shard)."""
        own = [_local(p.detach()).clone() for _, p in self.pairs]
        self._reshard()
        for e, p in self.pairs:
            _local(p.detach()).copy_(_local(e))
        try:
            yield
        finally:
            self._reshard()
            for (_, p), saved in zip(self.pairs, own):
                _local(p.detach()).copy_(saved)

    def _reshard(self) -> None:
        """FSDP2 keeps the root's gathered weights after a forward (no backward in an evaluation to free them):
        drop every gathered copy, so the next forward gathers the shards just written."""
        from torch.distributed.fsdp import FSDPModule

        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A host copy taken now ({name: tensor}, DTensor shards stay shards, tied names share one copy): the saver
        writes it later. Its own copy, not the model's staging buffers: those are reused once their save is done."""
        copies: dict[int, torch.Tensor] = {}
        for t in self.names.values():
            if id(t) not in copies:
                copies[id(t)] = _host_copy(t)
        return {name: copies[id(t)] for name, t in self.names.items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for name, t in state.items():
            _local(self.names[name]).copy_(_local(t))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded averages on rank 0's CPU (empty on the other ranks); a collective under FSDP2."""
        rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        full = {}
        for name, t in self.names.items():
            whole = t.full_tensor() if hasattr(t, "full_tensor") else t
            if rank0:
                full[name] = whole.detach().to("cpu", copy=True)
        return full
