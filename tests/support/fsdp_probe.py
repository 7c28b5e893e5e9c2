"""Run under `accelerate launch` with the FSDP2 config by test_fsdp.py, in bf16 mixed precision as production runs
it: an optimizer step of 4 micro-steps through train.py's micro-step context, then one of a single micro-step,
counting the collectives each rank issues in each and the dtypes they move; then what FSDP2 itself holds: each
unit's MixedPrecisionPolicy, the sharded parameters', gradients' and optimizer states' dtypes. Rank 0 prints it all
as JSON."""
import collections
import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from configs.model import MODEL_PRESETS, build_model
from utils.run.accelerator import make_accelerator
from utils.lm import lm_loss
from utils.optim import build_optimizer
from utils.sharding import check_prepared, describe, micro_step


class Collectives(TorchDispatchMode):
    """Counts the c10d operations (all-gather, reduce-scatter, all-reduce ...) dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self.dtypes = collections.defaultdict(set)  # op -> the dtypes of the tensors it moved

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            self.counts[func._opname] += 1
            self.dtypes[func._opname] |= {str(a.dtype) for a in args if isinstance(a, torch.Tensor)}
        return func(*args, **(kwargs or {}))


def dtypes(tensors) -> list[str]:
    return sorted({str(t.dtype) for t in tensors})


accelerator = make_accelerator("bf16", cuda=False, timeout_minutes=5)
sharded = accelerator.is_fsdp2
model = build_model(MODEL_PRESETS["rp2040-speed"])
model, optimizer = accelerator.prepare(model, build_optimizer(model, 1e-2, 0.1, (0.9, 0.95)))
layer_units = check_prepared(accelerator, model, sharded)
g = torch.Generator().manual_seed(accelerator.process_index)
steps, moved = [], collections.defaultdict(set)
for accumulation in (4, 1):
    with Collectives() as seen:
        for micro in range(accumulation):
            x = torch.randint(0, 256, (2, 16), generator=g)
            with micro_step(accelerator, model, last=micro == accumulation - 1):
                accelerator.backward(lm_loss(model, x, x) / accumulation)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        grads = dtypes(p.grad for p in model.parameters())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    steps.append(dict(seen.counts))
    for op, kinds in seen.dtypes.items():
        moved[op] |= kinds
units = [m._get_fsdp_state() for m in model.modules() if hasattr(m, "_get_fsdp_state")]
policies = {(str(u._mp_policy.param_dtype), str(u._mp_policy.reduce_dtype)) for u in units}
policies |= {(str(u._fsdp_param_group.mp_policy.param_dtype), str(u._fsdp_param_group.mp_policy.reduce_dtype))
             for u in units if u._fsdp_param_group is not None}
if accelerator.is_main_process:
    json.dump({"describe": describe(accelerator), "fsdp2_after_prepare": accelerator.is_fsdp2, "steps": steps,
               "layer_units": layer_units, "units": len(units),
               "collective_dtypes": {op: sorted(kinds) for op, kinds in moved.items()},
               "policies": sorted(policies), "params": dtypes(model.parameters()), "grads": grads,
               "optimizer_state": dtypes(t for s in optimizer.optimizer.state.values() for t in s.values())},
              sys.stdout)
accelerator.wait_for_everyone()
accelerator.end_training()
