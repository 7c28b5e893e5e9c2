"""Host memory of a save and load, per rank, under FSDP2 or DDP; run under `accelerate launch` (test_memory.py).

    memory_probe.py OUT_DIR DATA_DIR [NUM_LAYERS]

A ~100M-parameter GPT-NeoX is built as train.py builds it, sharded with FSDP2 (or replicated with DDP) over gloo,
trained one step (so AdamW has its states), saved like a checkpoint through the saver thread and loaded back.
Each rank prints one JSON line: the resident memory its model build took, the bytes it staged for the save, the
peak extra resident memory of the save and of the load (VmHWM after a reset through /proc/self/clear_refs),
whether the saver thread let the staged snapshot go once written (its buffers stay for the next save: Stager in
utils/ckpt/state.py), and the sizes to compare them with.
"""
import json
import sys
import weakref
from datetime import timedelta
from pathlib import Path

import torch

from configs.model import ModelConfig, build_model
from utils.ckpt.load import load_sharded
from utils.ckpt.state import Snapshot, rng_state, staged_share, tensor_bytes, tensor_leaves
from utils.ckpt.uploader import CheckpointUploader, SaveRequest
from utils.data.tokenizers import load_tokenizer
from utils.distributed import cpu_group, weights_come_from_rank0
from utils.run.accelerator import make_accelerator
from utils.lm import lm_loss
from utils.optim import build_optimizer

MB = 1 << 20


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
    return rss()


def peak() -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


out, data = Path(sys.argv[1]), Path(sys.argv[2])
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 14  # 14: ~100M parameters
accelerator = make_accelerator("no", False, 10)
rank = accelerator.process_index
cfg = ModelConfig(hidden_size=768, num_layers=layers, num_heads=12, intermediate_size=3072, max_position_embeddings=64,
                  vocab_size=256)
import transformers.models.gpt_neox.modeling_gpt_neox  # noqa: E402,F401 (imports are not the model's memory)
from accelerate import init_empty_weights  # noqa: E402,F401

before = rss()
model = build_model(cfg, shapes_only=weights_come_from_rank0(accelerator))
build = rss() - before
params = sum(p.numel() for p in model.parameters())
optimizer = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95))
model, optimizer = accelerator.prepare(model, optimizer)
x = torch.randint(0, 256, (1, 8))
lm_loss(model, x, x).backward()
optimizer.step()
optimizer.zero_grad(set_to_none=True)
unwrapped = accelerator.unwrap_model(model)

folder = out / "step-00000001"
base = reset_peak()
snap = Snapshot(step=1, rank=rank, world_size=accelerator.num_processes,
                     state=staged_share(unwrapped, optimizer.optimizer, rank, accelerator.num_processes),
                     weights=None,
                     rng=rng_state(), hf_config=unwrapped.config, tokenizer=load_tokenizer(data),
                     common={"run_config": ("json", {})})
staged = sum(tensor_bytes(t) for _, t in tensor_leaves(snap.state))
one_staged = weakref.ref(next(tensor_leaves(snap.state))[1])
uploader = CheckpointUploader(None, keep_local=1, progress=False, group=cpu_group(timedelta(minutes=10)),
                              rank=rank)
uploader.submit(SaveRequest(snap, folder))
del snap
uploader.flush()
save = peak() - base
freed = one_staged() is None  # the saver thread holds no staged copy once its write is done
uploader.close()
accelerator.wait_for_everyone()

base = reset_peak()
load_sharded(folder, unwrapped, optimizer.optimizer)
load = peak() - base
report = {"rank": rank, "build_mb": build / MB, "save_mb": save / MB, "load_mb": load / MB, "staged_mb": staged / MB,
          "freed": freed, "checkpoint_mb": sum(p.stat().st_size for p in folder.iterdir()) / MB,
          "weights_mb": params * 4 / MB, "optimizer_mb": params * 8 / MB}
# One write per line: both ranks share the pipe, and print's separate "\n" write let their lines interleave.
sys.stdout.write(json.dumps(report) + "\n")
sys.stdout.flush()
accelerator.wait_for_everyone()
torch.distributed.destroy_process_group()
