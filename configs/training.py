"""Training settings: a typed, validated dataclass. Presets live in configs/presets.py."""
from __future__ import annotations

from dataclasses import dataclass, replace

from configs.base import ConfigBase
from utils.run.budget import LONGEST
from utils.errors import PiconeoxError

MIXED_PRECISION = ("no", "fp16", "bf16")
ON_OFF_AUTO = ("auto", "on", "off")
COMPILE_BACKENDS = ("inductor", "aot_eager")
TOKENIZERS = ("char", "byte", "bpe")
MATMUL_PRECISION = ("highest", "high", "medium")
ATTENTION = ("sdpa", "eager")
BEST_FINAL_WEIGHTS = ("raw", "ema")
OPTIMIZERS = ("adamw", "muon")
LR_SCHEDULES = ("cosine", "wsd")


@dataclass(frozen=True)
class TrainConfig(ConfigBase):
    """How to train: data, batch, optimizer, schedule, evaluation, checkpoints and limits.

    Batch sizes are per process. The global batch (tokens per optimizer step, over all processes) is
    fixed for the whole run, whatever the number of processes: see `global_batch_tokens` and `for_world`.
    """

    SECTION = "train"
    DURATIONS = ("time_budget_s",)  # seconds that a flag or YAML may also write as 90m or 1h30m

    data: str = "demo"
    """A prepared dataset directory, a bucket URL of one (`gs://bucket/prefix`, `s3://bucket/prefix`), or `demo`
    (built in, prepared on first use)."""
    tokenizer: str = "byte"
    """Tokenizer used when this run prepares its data itself (`demo`): char, byte or bpe."""
    tokenizer_vocab: int | None = None
    """BPE vocabulary size, in tokens, when this run prepares its data itself: a whole number >= 257, bpe only
    (None: the tokenizer's default; char and byte size themselves)."""
    dataset_percent: float = 100.0
    """Keep a deterministic share of the documents when preparing data, in percent: in (0, 100]."""
    seq_len: int = 256
    """Tokens per training sequence (the context trained on): a whole number >= 1, at most
    model.max_position_embeddings."""
    micro_batch_size: int = 8
    """Sequences per process in one forward/backward pass (a micro-step): a whole number >= 1; `--batch-size auto`
    measures the largest that fits the GPU."""
    grad_accum_steps: int = 1
    """Micro-steps per optimizer step: a whole number >= 1; derived from global_batch_tokens when that is set."""
    global_batch_tokens: int = 0
    """Tokens per optimizer step over all processes. Set: grad_accum_steps is derived as
    global_batch_tokens / (micro_batch_size * seq_len * processes), so more GPUs mean less accumulation,
    not a bigger batch. 0: micro_batch_size * grad_accum_steps * seq_len * processes at the run's start.
    Either way a resume keeps the checkpoint's global batch on any number of processes."""
    max_steps: int = 1000
    """Optimizer steps of the whole run (a resume counts on from its step): a whole number >= 1; the schedule ends
    here."""
    learning_rate: float = 1e-3
    """AdamW's peak learning rate (every parameter, or with optimizer muon those Muon does not take): a number > 0;
    the schedule scales it."""
    min_lr_ratio: float = 0.1
    """The schedule ends at learning_rate * min_lr_ratio (and muon_lr * min_lr_ratio): in [0, 1]."""
    warmup_steps: int = 100
    """Optimizer steps of linear warmup from learning_rate / warmup_steps to the peak: a whole number >= 0."""
    lr_schedule: str = "cosine"
    """After the warmup: cosine (down to learning_rate * min_lr_ratio at max_steps) or wsd (warmup-stable-decay:
    the peak held, then a linear decay to the same floor over the last decay_fraction of the steps)."""
    decay_fraction: float = 0.2
    """wsd only: the share of max_steps (under a time budget, of the training time) spent decaying, in (0, 1]. A
    share of max_steps that rounds to no decay step (or a warmup that takes every step) is refused in one line."""
    optimizer: str = "adamw"
    """adamw (every parameter), or muon: torch.optim.Muon's math (Nesterov momentum, Newton-Schulz orthogonalised
    steps, run once per shape: utils/muon.py) on the 2-D weights inside the layers (attention and MLP
    projections), fused AdamW (learning_rate, beta1/beta2) on the embedding, the output head, biases and norms.
    Both decay with weight_decay; one schedule scales both lrs. Not with FSDP2 (sharded parameters): the run
    refuses it there."""
    muon_lr: float = 0.02
    """Muon's peak lr (optimizer muon). Each matrix's step is scaled to AdamW's update size (torch's
    adjust_lr_fn="match_rms_adamw": 0.2 sqrt(max(rows, cols))), so it reads like an AdamW lr."""
    muon_momentum: float = 0.95
    """Muon's momentum (Nesterov), in [0, 1)."""
    weight_decay: float = 0.1
    """Decoupled weight decay (AdamW's, and Muon's on its matrices), per step times the lr: a number >= 0; only
    matrices decay, never biases or norms."""
    beta1: float = 0.9
    """AdamW's decay rate of the gradient's running mean: in [0, 1)."""
    beta2: float = 0.95
    """AdamW's decay rate of the squared gradient's running mean: in [0, 1)."""
    grad_clip: float = 1.0
    """The largest total gradient norm (over all parameters) before the step; larger ones are scaled down to it: a
    number > 0 (train/grad_norm logs the norm before clipping)."""
    eval_every: int = 100
    """Optimizer steps between validation evaluations (and one at max_steps): a whole number >= 1."""
    eval_batches: int = 20
    """Micro-batches of validation data per evaluation, the split's first ones every time (fewer when the split
    is smaller): a whole number >= 1."""
    patience: int = 0
    """Stop after this many evaluations without a better val loss: a whole number >= 0; 0 disables early
    stopping."""
    save_every: int = 200
    """Optimizer steps between step-XXXXXXXX/ checkpoints (and one at the end): a whole number >= 1."""
    keep_last: int = 3
    """How many of the newest step-XXXXXXXX/ checkpoints stay on disk (older ones are deleted): a whole number
    >= 1."""
    best_and_final: bool = True
    """Also write best/ (the weights at each new best val loss) and, at the end, final/ (the last step plus its
    weights consolidated for from_pretrained). False keeps only the keep_last step-XXXXXXXX/ checkpoints: at 1.2B
    that is one 17 GB checkpoint instead of three writes (benchmarks/gpu_check.sh sets it, for a 64 GB disk)."""
    ema_decay: float = 0.0
    """Keep an exponential moving average of the weights with this decay (e.g. 0.999: about the last 1,000 steps),
    evaluated next to the raw weights (val/loss_ema) and checkpointed for an exact resume; 0 = off. Costs 4 bytes
    a parameter per rank (sharded under FSDP2) and one extra evaluation per eval."""
    best_final_weights: str = "raw"
    """Which weights best/ and final/ hold: raw (the trained ones) or ema (the average; needs ema_decay, and best/
    then follows the EMA's val loss). run_config.json in each checkpoint says which (train.best_final_weights)."""
    max_training_hours: float = 0.0
    """Save and exit cleanly after this many hours of training (a resume counts on): a number >= 0; 0 means no
    limit."""
    time_budget_s: float = 0.0
    """Wall-clock seconds for the whole run, from the process's start to its end (`--time-budget`; 600, 90m, 1h30m
    also work): the schedule follows the clock (warmup steps, then lr_schedule over the share of the training time
    done, its decay ending at the budget), and the final evaluation, save and sample fit inside it; max_steps is
    no limit then. A resume keeps the time its checkpoint had spent. 0: no budget (inside a Slurm job with a time
    limit, the job's end less run.grace_seconds is the budget)."""
    mixed_precision: str = "no"
    """The compute dtype under autocast: no (fp32), fp16 (with a loss scaler) or bf16; weights, gradients and
    optimizer state stay fp32."""
    compile: str = "auto"
    """torch.compile after accelerator.prepare(): auto = on with CUDA only."""
    compile_backend: str = "inductor"
    """The torch.compile backend: inductor (generated kernels: the speed) or aot_eager (the same forward and
    backward graphs run by eager kernels: compiles in seconds, for checking a compiled setup on CPU or telling an
    inductor problem from a tracing one)."""
    matmul_precision: str = "highest"
    """torch.set_float32_matmul_precision for float32 matmuls: highest (exact), high (TF32 on Ampere+ GPUs),
    medium (TF32 on GPUs; on CPU oneDNN's kernels, documented as bfloat16 products where AMX has them, measured
    float32-accurate on an AVX512-BF16 AMD EPYC: docs/runs.md, Presets)."""
    attention: str = "sdpa"
    """transformers' attention implementation: sdpa (the fused kernel) or eager (two matmuls, which medium
    precision speeds up on CPU; the fused CPU kernel gets slower under it)."""
    activation_checkpointing: str = "off"
    """Recompute each layer's activations in the backward pass: on, off, or auto (on when CUDA is there
    and the plan's memory estimate without it exceeds the GPU's memory)."""
    seed: int = 1337
    """Seeds torch, numpy and Python's random on every process, and the order of the training blocks (a permutation
    per epoch): a whole number in [0, 2**32)."""
    log_every: int = 10
    """Optimizer steps between training-loss lines and tracker scalars (a host sync): a whole number >= 1."""

    def validate(self) -> "TrainConfig":
        """Raise PiconeoxError (one line) for a bad value; return self."""
        from utils.lr_range import MAX_LR  # the range a resume obeys; torch-free, as the preflight validates too

        self.check_ints(("seq_len", "micro_batch_size", "grad_accum_steps", "max_steps", "eval_every", "eval_batches",
                         "save_every", "keep_last", "log_every"), 1)
        self.check_ints(("warmup_steps", "patience", "seed", "global_batch_tokens"), 0)
        if self.seed >= 2**32:  # numpy's seeds end there
            raise PiconeoxError(f"train.seed={self.seed}: must be below 2**32 = {2**32}")
        self.check_float("learning_rate", lambda v: 0 < v <= MAX_LR, f"a number > 0 and <= {MAX_LR:g}")
        self.check_float("min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]")
        self.check_float("dataset_percent", lambda v: 0 < v <= 100, "in (0, 100]")
        self.check_float("max_training_hours", lambda v: v >= 0, "a number of hours >= 0 (0 = no limit)")
        self.check_float("time_budget_s", lambda v: 0 <= v <= LONGEST, "seconds >= 0 (0 = no budget), e.g. 600 or 90m")
        self.check_float("weight_decay", lambda v: v >= 0, "a number >= 0")
        self.check_float("grad_clip", lambda v: v > 0, "a number > 0")
        for beta in ("beta1", "beta2"):  # AdamW's moment decay rates
            self.check_float(beta, lambda v: 0 <= v < 1, "in [0, 1), e.g. 0.9 or 0.95")
        self.check_float("decay_fraction", lambda v: 0 < v <= 1, "in (0, 1], e.g. 0.2")
        self.check_float("muon_lr", lambda v: 0 < v <= MAX_LR, f"a number > 0 and <= {MAX_LR:g}, e.g. 0.02")
        self.check_float("muon_momentum", lambda v: 0 <= v < 1, "in [0, 1), e.g. 0.95")
        if self.optimizer not in OPTIMIZERS:
            raise PiconeoxError(f"train.optimizer={self.optimizer!r}: allowed {', '.join(OPTIMIZERS)}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise PiconeoxError(f"train.lr_schedule={self.lr_schedule!r}: allowed {', '.join(LR_SCHEDULES)}")
        self.check_decay_steps()
        self.check_float("ema_decay", lambda v: 0 <= v < 1, "in [0, 1), e.g. 0.999 (0 = no EMA)")
        ema_without_decay = self.best_final_weights == "ema" and not self.ema_decay
        if self.best_final_weights not in BEST_FINAL_WEIGHTS or ema_without_decay:
            raise PiconeoxError(f"train.best_final_weights={self.best_final_weights!r}: allowed raw, or ema together "
                                "with train.ema_decay (e.g. 0.999)")
        if self.mixed_precision not in MIXED_PRECISION:
            raise PiconeoxError(f"train.mixed_precision={self.mixed_precision!r}: allowed {', '.join(MIXED_PRECISION)}")
        if self.compile not in ON_OFF_AUTO:
            raise PiconeoxError(f"train.compile={self.compile!r}: allowed {', '.join(ON_OFF_AUTO)}")
        if self.compile_backend not in COMPILE_BACKENDS:
            raise PiconeoxError(f"train.compile_backend={self.compile_backend!r}: allowed "
                                f"{', '.join(COMPILE_BACKENDS)}")
        if self.matmul_precision not in MATMUL_PRECISION:
            raise PiconeoxError(f"train.matmul_precision={self.matmul_precision!r}: allowed "
                                f"{', '.join(MATMUL_PRECISION)}")
        if self.attention not in ATTENTION:
            raise PiconeoxError(f"train.attention={self.attention!r}: allowed {', '.join(ATTENTION)}")
        if self.activation_checkpointing not in ON_OFF_AUTO:
            raise PiconeoxError(f"train.activation_checkpointing={self.activation_checkpointing!r}: allowed "
                                f"{', '.join(ON_OFF_AUTO)}")
        if self.tokenizer not in TOKENIZERS:
            raise PiconeoxError(f"train.tokenizer={self.tokenizer!r}: allowed {', '.join(TOKENIZERS)}")
        if self.tokenizer == "bpe" and self.tokenizer_vocab is not None:
            self.check_ints(("tokenizer_vocab",), 257)
        elif self.tokenizer_vocab not in (None, 256 if self.tokenizer == "byte" else None):
            raise PiconeoxError(f"train.tokenizer_vocab={self.tokenizer_vocab!r}: only for tokenizer bpe "
                                f"(this run's {self.tokenizer} tokenizer sizes itself; set it to null)")
        return self

    def check_decay_steps(self) -> None:
        """A step-counted wsd schedule must decay for at least one step: a decay_fraction that rounds to zero steps
        (or a warmup that takes them all) would train at the peak lr to the end, and a run must not do that
        silently. A time budget decays on the clock, so any fraction works there."""
        if self.lr_schedule != "wsd" or self.time_budget_s:
            return
        decay_start = max(self.warmup_steps, self.max_steps - round(self.decay_fraction * self.max_steps))
        if decay_start >= self.max_steps:
            cause = (f"train.warmup_steps={self.warmup_steps} takes every step" if self.warmup_steps >= self.max_steps
                     else f"train.decay_fraction={self.decay_fraction:g} of train.max_steps={self.max_steps} rounds to "
                          "0 decay steps")
            need = 1 / self.max_steps
            raise PiconeoxError(f"{cause}: lr_schedule wsd would never decay; use decay_fraction >= {need:.2g} (at "
                                "least one step) with fewer warmup steps than max_steps, or lr_schedule cosine")

    def for_world(self, world_size: int, fixed_global_batch: int | None = None) -> "TrainConfig":
        """This recipe on `world_size` processes: global_batch_tokens filled in, grad_accum_steps derived.

        `fixed_global_batch` (a resumed checkpoint's tokens per step, or this run's after --batch-size auto)
        is kept, so a resume on another number of processes keeps the schedule. One PiconeoxError line when the
        global batch is not a whole number of micro batches on every process, or a setting contradicts it.
        """
        target = fixed_global_batch or self.global_batch_tokens
        if fixed_global_batch and self.global_batch_tokens not in (0, fixed_global_batch):
            raise PiconeoxError(
                f"train.global_batch_tokens={self.global_batch_tokens:,}: the checkpoint trained with "
                f"{fixed_global_batch:,} tokens per step, and a resume keeps its global batch; drop the setting")
        if not target:
            tokens = self.micro_batch_size * self.grad_accum_steps * self.seq_len * world_size
            return replace(self, global_batch_tokens=tokens)
        per_micro_step = self.micro_batch_size * self.seq_len * world_size
        accum, rest = divmod(target, per_micro_step)
        if rest or accum < 1:
            raise PiconeoxError(
                f"train.global_batch_tokens={target:,} is not a whole multiple of micro_batch_size x seq_len x "
                f"processes = {self.micro_batch_size} x {self.seq_len} x {world_size} = {per_micro_step:,} tokens; "
                "change the micro batch (--batch-size) or the global batch")
        if self.global_batch_tokens and not fixed_global_batch and self.grad_accum_steps not in (1, accum):
            raise PiconeoxError(
                f"train.grad_accum_steps={self.grad_accum_steps} disagrees with train.global_batch_tokens="
                f"{target:,}, which needs {accum} on {world_size} process(es); set only one of them")
        return replace(self, global_batch_tokens=target, grad_accum_steps=accum)

    def largest_micro_batch(self, world_size: int, limit: int) -> int:
        """The largest micro batch <= `limit` that divides the global batch's sequences per process (>= 1)."""
        per_process = self.global_batch_tokens // (self.seq_len * world_size)
        return max((b for b in range(1, min(limit, per_process) + 1) if per_process % b == 0), default=1)
