"""Run under `accelerate launch` with the FSDP2 config by test_fsdp.py: an optimizer step of 4 micro-steps through
train.py's micro-step context, then one of a single micro-step, counting the collectives each rank issues in each;
rank 0 prints them as JSON."""
import collections
import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from configs.model import MODEL_PRESETS, build_model
from utils.distributed import make_accelerator
from utils.lm import lm_loss
from utils.optim import build_optimizer
from utils.sharding import check_prepared, describe, micro_step


class Collectives(TorchDispatchMode):
    """Counts the c10d operations (all-gather, reduce-scatter, all-reduce ...) dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            self.counts[func._opname] += 1
        return func(*args, **(kwargs or {}))


accelerator = make_accelerator("no", cuda=False, timeout_minutes=5)
sharded = accelerator.is_fsdp2
model = build_model(MODEL_PRESETS["rp2040-speed"])
model, optimizer = accelerator.prepare(model, build_optimizer(model, 1e-2, 0.1, (0.9, 0.95)))
check_prepared(accelerator, model, sharded)
g = torch.Generator().manual_seed(accelerator.process_index)
steps = []
for accumulation in (4, 1):
    with Collectives() as seen:
        for micro in range(accumulation):
            x = torch.randint(0, 256, (2, 16), generator=g)
            with micro_step(accelerator, model, last=micro == accumulation - 1):
                accelerator.backward(lm_loss(model, x, x) / accumulation)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    steps.append(dict(seen.counts))
if accelerator.is_main_process:
    json.dump({"describe": describe(accelerator), "fsdp2_after_prepare": accelerator.is_fsdp2, "steps": steps},
              sys.stdout)
accelerator.wait_for_everyone()
accelerator.end_training()
