"""Muon with one Newton-Schulz iteration per *shape*, not per matrix: torch.optim.Muon's math and state, batched.

torch.optim.Muon orthogonalises its matrices one at a time: 5 iterations x 3 matmuls each, so a 4-layer model's 16
matrices cost 240 small matmuls a step, and on a CPU their dispatch, not their arithmetic, is most of the time.
`BatchedMuon` stacks the matrices of one shape and runs the same iteration on the stack (bmm instead of mm, the
same bfloat16, the same coefficients, each matrix normalised by its own norm): bit-identical updates to
torch.optim.Muon's (tests/unit/test_muon.py), in about half the time (benchmarks/README.md, Levers for a budget).
The state is torch's (`momentum_buffer` per matrix), so checkpoints written by either load in the other.
"""
from __future__ import annotations

import torch
from torch.optim._muon import _adjust_lr


def orthogonalise(stack: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> torch.Tensor:
    """torch.optim.Muon's quintic Newton-Schulz iteration on a stack of same-shape matrices (n, rows, cols)."""
    a, b, c = coefficients
    x = stack.bfloat16()
    tall = stack.size(-2) > stack.size(-1)
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # each matrix's spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def closure_loss(closure):
    """torch.optim's step contract: a closure re-evaluates the model, with gradients on, and gives the loss."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon (Nesterov momentum, decoupled weight decay, `adjust_lr_fn`) with `orthogonalise` run once
    per group of same-shape matrices."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for group in self.param_groups:
            by_shape: dict[torch.Size, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_shape.setdefault(p.shape, []).append(p)
            for shape, params in by_shape.items():
                self._step_shape(group, shape, params)
        return loss

    def _step_shape(self, group: dict, shape: torch.Size, params: list[torch.Tensor]) -> None:
        grads = [p.grad for p in params]
        if any(g.is_sparse or torch.is_complex(g) for g in grads):
            raise RuntimeError("Muon supports neither sparse nor complex gradients")
        bufs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            bufs.append(state["momentum_buffer"])
        momentum = group["momentum"]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)
        updates = torch.stack([g.lerp(b, momentum) for g, b in zip(grads, bufs)]) if group["nesterov"] \
            else torch.stack(bufs)
        ortho = orthogonalise(updates, group["ns_coefficients"], group["ns_steps"], group["eps"])
        lr = group["lr"].item() if torch.is_tensor(group["lr"]) else group["lr"]
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        torch._foreach_add_(params, list(ortho.unbind(0)), alpha=-_adjust_lr(lr, group["adjust_lr_fn"], shape))
