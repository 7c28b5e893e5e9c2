"""The language model's one loss, its evaluation and its sampling: the training loop, utils.generate and the
micro-batch probe all use these, so a validation loss means the same everywhere."""
from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterable

import torch

from utils.errors import PiconeoxError


class TrainingDiverged(PiconeoxError):
    """A NaN or inf loss: the run stops and names the step."""


def lm_loss(model, x, y):
    """Next-token cross-entropy; the loader already shifted the labels, so the model gets no `labels`."""
    import torch.nn.functional as F

    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))


def checkpoint_activations(model) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (non-reentrant
    torch checkpointing, the default of every supported transformers version, passed explicitly).

    `gradient_checkpointing_enable` is the name every supported transformers version has (requirements.txt):
    5.17 has no `activation_checkpointing_enable`, and 5.23 keeps the old name as an alias until v6 (its
    deprecation warning is silenced here, once, instead of surprising every run).
    """
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing_enable.*", category=FutureWarning)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def to_device(batch, device):
    """A loader batch on `device`: on CUDA through pinned memory, asynchronously (no wait for the copy)."""
    if device.type != "cuda":
        return batch
    return tuple(t.pin_memory().to(device, non_blocking=True) for t in batch)


def evaluate(model, batches: Iterable, device, *, autocast: Callable = contextlib.nullcontext, vote=None,
             reduce: Callable | None = None) -> float | None:
    """Mean loss over `batches` (`reduce` averages it over ranks); the model is left in training mode.

    `vote` (a StopVote) is asked before every batch; None is returned when the ranks agreed to stop.
    """
    model.eval()
    total = torch.zeros((), device=device)
    count = 0
    with torch.no_grad():
        for batch in batches:
            if vote is not None and vote():
                break
            with autocast():
                total += lm_loss(model, *to_device(batch, device))
            count += 1
    model.train()
    if vote is not None and vote.stopping:
        return None
    mean = total / max(count, 1)
    return (reduce(mean) if reduce else mean).item()


@torch.no_grad()
def forward_seconds(model, batch: int, length: int, device) -> float:
    """Wall seconds of one forward pass of `batch` x `length` tokens (the second of two: the first allocates), for
    a time budget's estimate of the final evaluation and sample; the model is left as it was. Every rank must call
    it (under FSDP2 a forward all-gathers)."""
    import time

    was_training = model.training
    model.eval()
    x = torch.zeros((batch, min(length, model.config.max_position_embeddings)), dtype=torch.long, device=device)
    with torch.no_grad():
        for _ in range(2):
            start = time.perf_counter()
            model(input_ids=x).logits.sum().item()  # .item(): the GPU's queue done
    model.train(was_training)
    return time.perf_counter() - start


def sample_text(model, tokenizer, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
                top_k: int | None = 40, seed: int = 0, deadline: float | None = None, stop=None) -> str:
    """Prompt plus `max_new_tokens` sampled tokens, fewer when time.monotonic() passes `deadline` or `stop()` says so
    (only where no forward is a collective: each rank may stop at another token); the context is cropped to the
    model's positions."""
    import time

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    ids = tokenizer.encode(prompt, add_special_tokens=False) or [tokenizer.eos_token_id]
    x = torch.tensor([ids], dtype=torch.long, device=device)
    ctx = model.config.max_position_embeddings
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(max_new_tokens):
        if (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop()):
            break
        logits = model(input_ids=x[:, -ctx:]).logits[0, -1].float().cpu()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits[logits < kth] = -math.inf
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        x = torch.cat([x, torch.tensor([[nxt]], device=device)], dim=1)
    model.train(was_training)
    return tokenizer.decode(x[0].tolist(), skip_special_tokens=False)


def find_micro_batch(model, seq_len: int, accelerator, start: int = 256) -> int:
    """The largest micro batch (halving from `start` on out-of-memory) whose forward/backward fits.

    The probe runs before the optimizer allocates its AdamW states, so leave headroom on tight GPUs.
    """
    from accelerate.utils import find_executable_batch_size

    @find_executable_batch_size(starting_batch_size=start)
    def probe(batch_size: int) -> int:
        x = torch.zeros(batch_size, seq_len, dtype=torch.long, device=accelerator.device)
        with accelerator.autocast():
            lm_loss(model, x, x).backward()
        model.zero_grad(set_to_none=True)
        return batch_size

    return probe()


def auto_micro_batch(tc, model, accelerator, shapes_only: bool, log):
    """--batch-size auto: `tc` (a TrainConfig) with the largest micro batch that fits on every rank and divides
    the global batch; unchanged without CUDA (nothing to measure) and under FSDP2 (no probe before sharding)."""
    from dataclasses import replace

    world = accelerator.num_processes
    if accelerator.device.type != "cuda":
        log.info(f"--batch-size auto: micro batch {tc.micro_batch_size} (no CUDA: the preset's size; auto needs a "
                 "GPU to measure)")
        return tc
    if accelerator.is_fsdp2:
        log.warning("--batch-size auto: FSDP2 cannot probe before sharding; using the preset's micro batch")
        return tc
    probed = 1 << 30 if shapes_only else find_micro_batch(model, tc.seq_len, accelerator)  # shapes only: no probe
    found = torch.tensor(-probed, device=accelerator.device)  # max of negatives = the smallest over ranks
    fits = tc.largest_micro_batch(world, limit=-int(accelerator.reduce(found, "max").item()))
    log.info(f"--batch-size auto: micro batch {fits}")
    return replace(tc, micro_batch_size=fits).for_world(world, fixed_global_batch=tc.global_batch_tokens)
