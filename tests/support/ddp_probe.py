"""Run under `accelerate launch` by test_distributed.py: one training step, then every rank reports
its world size and a checksum of its parameters, so the test can see that each rank really joined."""
import json
import sys

import torch
from accelerate import Accelerator

from configs.model import MODEL_PRESETS, build_model
from utils.lm import lm_loss
from utils.optim import build_optimizer

accelerator = Accelerator(cpu=True)
torch.manual_seed(accelerator.process_index)  # different init per rank: DDP must broadcast rank 0's
model = build_model(MODEL_PRESETS["rp2040-speed"])
model, optimizer = accelerator.prepare(model, build_optimizer(model, 1e-2, 0.1, (0.9, 0.95)))
g = torch.Generator().manual_seed(100 + accelerator.process_index)  # different data per rank
x = torch.randint(0, 256, (2, 16), generator=g)
accelerator.backward(lm_loss(model, x, x))
optimizer.step()
checksum = torch.tensor([sum(p.double().sum().item() for p in model.parameters())])
sums = accelerator.gather(checksum).tolist()
if accelerator.is_main_process:
    json.dump({"world_size": accelerator.num_processes, "checksums": sums}, sys.stdout)
accelerator.wait_for_everyone()  # tear the gloo group down together: a rank leaving alone can abort
accelerator.end_training()
