"""A tiny GPT-NeoX really training on the demo corpus, captured like train.py captures a run, for the checkpoint
uploader's tests; and the bucket's latest complete step loaded as a resume loads it."""
from pathlib import Path

import torch

from configs.model import ModelConfig, build_model
from utils.ckpt.bucket.remote import download_checkpoint, latest_complete_step, remote_steps
from utils.ckpt.load import load_model, read_part
from utils.ckpt.parts import Registry, TrainerState, training_parts
from utils.ckpt.state import Snapshot
from utils.data.loader import BlockLoader
from utils.data.tokenizers import load_tokenizer
from utils.lm import lm_loss
from utils.optim import build_optimizer, build_scheduler
from utils.report.metrics import MetricsWriter
from utils.storage import Storage


TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, max_position_embeddings=32,
                   vocab_size=256)


class Trainer:
    """A GPT-NeoX (tiny by default) really training on the demo corpus; `snapshot()` captures it like train.py does."""

    def __init__(self, data_dir: Path, log_dir: Path, cfg: ModelConfig = TINY, *, lr: float = 3e-3,
                 warmup: int = 2, total: int = 100, batch: int = 4, seed: int = 1):
        """`cfg` the model (its max_position_embeddings the sequence length), AdamW at `lr` with `warmup` steps of
        `total`, `batch` sequences a step from the loader seeded with `seed`; torch's seed 0 for the weights."""
        torch.manual_seed(0)
        self.model = build_model(cfg)
        self.optimizer = build_optimizer(self.model, lr, 0.1, (0.9, 0.95))
        self.scheduler = build_scheduler(self.optimizer, warmup, total, 0.1)
        self.loader = BlockLoader(data_dir, "train", cfg.max_position_embeddings, batch, seed=seed)
        self.tokenizer = load_tokenizer(data_dir)
        self.metrics = MetricsWriter(log_dir, True)
        self.state = TrainerState()
        self.run_config = {"model": cfg.to_dict()}

    def step(self) -> None:
        x, y = next(self.loader)
        lm_loss(self.model, x, y).backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1

    def snapshot(self) -> Snapshot:
        parts = training_parts(scheduler=self.scheduler, scaler=None, loader=self.loader, trainer=self.state,
                               metrics=self.metrics)
        registry = Registry(self.model, self.optimizer, parts, run_config=self.run_config, tokenizer=self.tokenizer)
        return registry.capture(self.state.step)


def latest_loads(store: Storage, cache: Path) -> int:
    """Download the remote latest complete checkpoint and load it like a resume does; return its step."""
    step = latest_complete_step(remote_steps(store))
    folder = download_checkpoint(store, step, cache, progress=False)
    model = load_model(folder)  # crc32c-verified against the marker
    assert read_part(folder, "trainer")["step"] == step and model.num_parameters() > 0
    return step
