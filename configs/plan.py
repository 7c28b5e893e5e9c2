"""A run's plan before any work: parameters, batch, tokens, FLOPs, and memory per GPU under DDP and FSDP.

The model is built on PyTorch's meta device (shapes only, no storage), so the 1.2B preset plans in
seconds on a laptop. Memory is an estimate of the big terms, in bytes per GPU:

- weights, gradients and optimizer states are fp32 (mixed precision autocasts the compute, the master
  weights stay fp32): 4 + 4 bytes per parameter, + the optimizer's state as utils/optim.py counts it
  (`state_bytes`: AdamW 8 a parameter; Muon 4 on the layers' matrices), + 4 for the weights' EMA
  (train.ema_decay, counted with the optimizer; its evaluation copies the weights aside for a moment, not
  counted). An optimizer that refuses sharded parameters (`utils.optim.refusal`) gets no FSDP column. DDP keeps all of
  them on every GPU; FSDP full keeps 1/world of each, plus the unsharded weights in the compute dtype:
  configs/accelerate/fsdp_production.yaml keeps every layer gathered from its forward to its backward
  (reshard_after_forward: false), so at the end of a forward all of them are.
- activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", section 4.1: s*b*h*(34 + 5*a*s/h) bytes per layer with 16-bit activations. Our models run
  SDPA (flash / memory-efficient kernels) that never store the a*s*s score matrices, so the 5*a*s/h
  term is dropped: 34*s*b*h per layer (34 includes dropout masks: an upper bound at dropout 0). With
  activation checkpointing of every layer only its 2*s*b*h input is kept, plus one layer's full
  activations while it is recomputed. The logits add s*b*V*(2 + 4 + 4 + 4) bytes: 16-bit logits,
  accelerate's fp32 copy of the model's outputs, their fp32 upcast for the loss, and the saved
  log-softmax. fp32 training doubles the activation bytes (and has no 16-bit logits to copy).
- buffers: DDP copies the gradients into its all-reduce buckets (4 bytes a parameter again: our runs
  do not use gradient_as_bucket_view); FSDP2 accumulating over micro-steps keeps unsharded fp32
  gradient accumulators for every parameter until the last micro-step reduce-scatters them.
- not counted: CUDA context and kernels (~0.5-1 GB), allocator fragmentation, communication buffers.
"""
from __future__ import annotations

import os

from dataclasses import dataclass

from configs.model import build_model, count_parameters
from configs.presets import RunConfig
from utils.errors import PiconeoxError
from utils.optim import refusal, state_bytes
from utils.run.budget import describe

MIB, GIB = 1024**2, 1024**3


def matmul_params(model_cfg) -> int:
    """Parameters that do multiply-adds for every token in a GPT-NeoX of this shape (configs.model.ModelConfig).

    = all decoder layers (QKV, attention output, both MLP matrices, their biases, both LayerNorms), the
    final LayerNorm, and the output projection (lm_head, vocab x hidden: a real matmul even when tied).
    The input embedding is a table lookup with no FLOPs and is left out. This is Kaplan et al.'s
    "non-embedding" N plus lm_head, as nanoGPT's MFU counts it.
    """
    h, i, v = model_cfg.hidden_size, model_cfg.intermediate_size, model_cfg.vocab_size
    per_layer = (
        h * 3 * h + 3 * h  # query_key_value
        + h * h + h  # attention dense
        + h * i + i  # dense_h_to_4h
        + i * h + h  # dense_4h_to_h
        + 2 * 2 * h  # input_layernorm, post_attention_layernorm (weight + bias)
    )
    return model_cfg.num_layers * per_layer + 2 * h + v * h


def model_flops_per_token(model_cfg, seq_len: int) -> float:
    """Training FLOPs per token: 6N + 12 * L * d_model * T.

    From PaLM (Chowdhery et al. 2022, appendix B; as in Chinchilla, Hoffmann et al. 2022): forward 2N
    plus backward 4N for the weight matmuls, with N = `matmul_params` (see there which N), plus
    12 * layers * (heads * head_dim = d_model) * seq_len for the attention score and value matmuls
    (the full T x T, causal masking not subtracted, as PaLM counts it). Activation recomputation is
    not counted: this is model FLOPs, not hardware FLOPs.
    """
    n = matmul_params(model_cfg)
    return 6.0 * n + 12.0 * model_cfg.num_layers * model_cfg.hidden_size * seq_len



SHARD_FROM_PARAMETERS = 1_000_000_000
"""Runs on several GPUs of models this large default to FSDP2 (start_training.sh): under DDP every GPU would hold
20 bytes a parameter (fp32 weights, gradients, AdamW states, gradient buckets: 18.6 GiB at 1B, before any
activation) and every rank would build its own fp32 model in host memory (4 GB a GPU at 1B)."""


def launch_refusal(run_cfg: RunConfig, gpus: int) -> str | None:
    """One line when the optimizer refuses the sharding start_training.sh would launch on `gpus` GPUs (the plan of
    a run that cannot start is no plan); None when it can start."""
    if default_sharding(run_cfg, gpus) != "fsdp" or not (why := refusal(run_cfg.train.optimizer, sharded=True)):
        return None
    return (f"--gpus {gpus}: start_training.sh shards a model of {SHARD_FROM_PARAMETERS:,}+ parameters with FSDP2 on "
            f"several GPUs, and {why}")


def default_sharding(run_cfg: RunConfig, gpus: int) -> str:
    """'fsdp' or 'ddp': what the launcher picks for `gpus` GPUs in all when no accelerate config is given, from the
    model's size (the resolved model section, not the preset's name). Counted without torch: the launcher asks
    before every multi-GPU start. Untied embeddings are assumed (an upper bound). On several machines FSDP2 runs
    as HSDP (utils/sharding.py)."""
    model_cfg, train = run_cfg.model, run_cfg.train
    model_cfg = model_cfg.with_vocab(model_cfg.vocab_size or train.tokenizer_vocab or 256)
    parameters = matmul_params(model_cfg) + model_cfg.vocab_size * model_cfg.hidden_size  # + the input embedding
    return "fsdp" if gpus > 1 and parameters >= SHARD_FROM_PARAMETERS else "ddp"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU for one sharding strategy (see the module docstring for the formulas)."""

    weights: int
    """fp32 master weights (this GPU's share), plus FSDP's weights gathered in the compute dtype."""
    grads: int
    """fp32 gradients (this GPU's share)."""
    optimizer: int
    """The optimizer's state as utils.optim.state_bytes counts it, plus the EMA's 4 bytes a parameter."""
    activations: int
    """Without activation checkpointing."""
    activations_checkpointed: int
    """With every decoder layer checkpointed."""
    buffers: int
    """DDP's gradient buckets, FSDP2's unsharded gradient accumulators."""

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.buffers + self.activations

    @property
    def total_checkpointed(self) -> int:
        return self.weights + self.grads + self.optimizer + self.buffers + self.activations_checkpointed


@dataclass(frozen=True)
class Plan:
    """What a run will do and roughly what it needs, before it does anything."""

    preset: str
    """The preset planned (RunConfig.preset)."""
    gpus: int
    """GPUs in the whole job (0 = a CPU run, planned as one process)."""
    shard_gpus: int
    """The GPUs one FSDP2 shard group spans: all of them, or one machine's under HSDP (several machines)."""
    vocab_size: int
    """The model's vocabulary, resolved (see `plan`)."""
    parameters: int
    """Unique parameters (tied embeddings counted once)."""
    layer_parameters: int
    """Parameters of one decoder layer (an FSDP unit)."""
    seq_len: int
    """Tokens per sequence."""
    micro_batch_size: int
    """Sequences per process in one micro-step."""
    grad_accum_steps: int
    """Micro-steps per optimizer step on this many GPUs (the global batch kept)."""
    batch_tokens: int
    """Tokens per optimizer step: micro batch x accumulation x processes x sequence length."""
    steps: int
    """Optimizer steps (train.max_steps)."""
    total_tokens: int
    """Tokens the run trains on: batch_tokens x steps."""
    flops_per_token: float
    """Training model FLOPs per token (utils.report.metrics.model_flops_per_token)."""
    optimizer: str
    """train.optimizer, whose state the estimates count."""
    ddp: MemoryEstimate
    """Bytes per GPU under DDP (every GPU holds everything)."""
    fsdp: MemoryEstimate | None
    """None when the optimizer refuses sharded parameters (utils.optim.refusal)."""

    @property
    def total_flops(self) -> float:
        return self.flops_per_token * self.total_tokens


def plan(run_cfg: RunConfig, gpus: int, tokenizer_vocab: int | None = None, machines: int = 1) -> Plan:
    """Plan `run_cfg` on `gpus` GPUs in total (0: CPU, one process) spread over `machines`: on several, FSDP2 runs
    as HSDP (utils/sharding.py) and each GPU holds 1/(GPUs of one machine) of the state, not 1/gpus.

    The vocab comes from `tokenizer_vocab` (the prepared dataset's tokenizer) when given, else the
    model's own vocab_size, else the preset's tokenizer_vocab, else 256 (byte/char tokenizers).
    """
    if not isinstance(gpus, int) or gpus < 0:
        raise PiconeoxError(f"--gpus {gpus!r}: must be a whole number >= 0")
    if not isinstance(machines, int) or machines < 1 or max(gpus, 1) % machines:
        raise PiconeoxError(f"--machines {machines!r}: must be a whole number >= 1 that divides --gpus {gpus}")
    import torch

    from utils.sharding import hsdp_shape

    model_cfg, train = run_cfg.model, run_cfg.train
    vocab = tokenizer_vocab or model_cfg.vocab_size or train.tokenizer_vocab or 256
    model_cfg = model_cfg.with_vocab(vocab)
    with torch.device("meta"):  # shapes only: no weight is allocated
        model = build_model(model_cfg)
    parameters = count_parameters(model)
    optimizer_bytes = state_bytes(model, train.optimizer)
    layer = sum(p.numel() for p in model.gpt_neox.layers[0].parameters())

    world = max(gpus, 1)
    hsdp = hsdp_shape(world, world // machines)
    shard_gpus = hsdp[1] if hsdp else world
    train = train.for_world(world)  # the accumulation that keeps the global batch on this many GPUs
    s, b = train.seq_len, train.micro_batch_size
    h, L, V = model_cfg.hidden_size, model_cfg.num_layers, model_cfg.vocab_size
    batch_tokens = train.global_batch_tokens
    half = train.mixed_precision in ("fp16", "bf16")
    act_scale = 1 if half else 2  # Korthikanti's byte counts assume 16-bit activations
    compute_bytes = 2 if half else 4
    layer_act = 34 * s * b * h * act_scale
    logits = s * b * V * (14 if half else 8)
    activations = L * layer_act + logits
    activations_ckpt = L * 2 * s * b * h * act_scale + layer_act + logits

    def estimate(shards: int, gathered: int, buffers: int) -> MemoryEstimate:
        return MemoryEstimate(
            buffers=buffers,
            weights=4 * parameters // shards + gathered,
            grads=4 * parameters // shards,
            optimizer=(optimizer_bytes + (4 * parameters if train.ema_decay else 0)) // shards,
            activations=activations,
            activations_checkpointed=activations_ckpt,
        )

    return Plan(
        preset=run_cfg.preset,
        gpus=gpus,
        shard_gpus=shard_gpus,
        vocab_size=V,
        parameters=parameters,
        layer_parameters=layer,
        seq_len=s,
        micro_batch_size=b,
        grad_accum_steps=train.grad_accum_steps,
        batch_tokens=batch_tokens,
        steps=train.max_steps,
        total_tokens=batch_tokens * train.max_steps,
        flops_per_token=model_flops_per_token(model_cfg, s),
        optimizer=train.optimizer,
        ddp=estimate(1, 0, 4 * parameters),
        fsdp=None if refusal(train.optimizer, sharded=True) else
        estimate(shard_gpus, compute_bytes * parameters, 4 * parameters if train.grad_accum_steps > 1 else 0),
    )


def format_plan(p: Plan, time_budget_s: float = 0.0) -> str:
    """A human-readable table of the plan; with a time budget (train.time_budget_s), the budget for the steps."""
    where = f"{p.gpus} GPU(s)" if p.gpus else "CPU (1 process)"
    lines = [
        f"plan for preset '{p.preset}' on {where}",
        f"  parameters        {p.parameters:,} (one decoder layer: {p.layer_parameters:,}; vocab {p.vocab_size:,})",
        f"  batch             {p.micro_batch_size} seqs x {p.seq_len} tokens x {p.grad_accum_steps} accum x "
        f"{max(p.gpus, 1)} procs = {p.batch_tokens:,} tokens/step",
        f"  steps             {p.steps:,}",
        f"  tokens in total   {p.total_tokens:,} ({p.total_tokens / p.parameters:.1f} per parameter)",
        f"  training FLOPs    {p.flops_per_token:.3e} per token, {p.total_flops:.3e} in total",
    ]
    if time_budget_s:  # as many steps as fit: neither a step count nor a total before the run
        lines[3:6] = [f"  time budget       {describe(time_budget_s)}, start-up to final save: as many steps as fit "
                      "(the lr decay ends at it)", f"  training FLOPs    {p.flops_per_token:.3e} per token"]
    unit, size = ("GiB", GIB) if p.ddp.total >= GIB else ("MiB", MIB)
    fsdp = "FSDP" if p.shard_gpus == max(p.gpus, 1) else "HSDP"
    lines += ["", f"  memory per GPU ({unit}){'DDP':>18} {fsdp if p.fsdp else '':>10}".rstrip()]
    rows = [
        ("weights (fp32 master)", "weights"),
        ("gradients (fp32)", "grads"),
        (f"{'AdamW' if p.optimizer == 'adamw' else 'Muon+AdamW'} states (+ EMA)", "optimizer"),
        ("grad buckets/accumulators", "buffers"),
        ("activations", "activations"),
        ("  with act. checkpointing", "activations_checkpointed"),
        ("total", "total"),
        ("  with act. checkpointing", "total_checkpointed"),
    ]
    for label, attr in rows:
        sharded = f"{getattr(p.fsdp, attr) / size:>10.2f}" if p.fsdp else ""
        lines.append(f"  {label:<28} {getattr(p.ddp, attr) / size:>10.2f} {sharded}".rstrip())
    if not p.fsdp:
        lines.append(f"  (no {fsdp} column: {refusal(p.optimizer, sharded=True)})")
    elif fsdp == "HSDP":
        lines.append(f"  (HSDP: each machine's {p.shard_gpus} GPUs shard the state, {p.gpus // p.shard_gpus} machines "
                     "hold replicas)")
    lines.append("  (estimates: see configs/plan.py; add ~1 GiB for the CUDA context and allocator slack)")
    return "\n".join(lines)


def needs_activation_checkpointing(p: Plan, sharded: bool, device_bytes: int) -> bool:
    """Whether the estimate without activation checkpointing leaves less than 10% of the GPU free.

    The 10% is headroom for what the estimate leaves out (CUDA context, fragmentation, buffers).
    """
    estimate = p.fsdp if sharded else p.ddp
    return estimate.total > 0.9 * device_bytes


def use_activation_checkpointing(cfg, accelerator, cuda: bool) -> bool:
    """on/off as set; auto: on with CUDA when the plan's memory estimate does not fit the GPU."""
    mode = cfg.train.activation_checkpointing
    if mode != "auto" or not cuda:
        return mode == "on"
    import torch
    from accelerate.utils import DistributedType

    device_bytes = torch.cuda.get_device_properties(accelerator.device).total_memory
    sharded = accelerator.distributed_type == DistributedType.FSDP
    world = accelerator.num_processes
    machines = world // int(os.environ.get("LOCAL_WORLD_SIZE", world))  # HSDP shards within one machine
    return needs_activation_checkpointing(plan(cfg, gpus=world, machines=max(machines, 1)), sharded, device_bytes)
