"""Model shapes: a typed dataclass mapped onto transformers' GPT-NeoX, and the named presets.

Every model in piconeox is a `GPTNeoXForCausalLM` built from a `GPTNeoXConfig` made here; nothing is
downloaded from a hub.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from configs.base import ConfigBase
from utils.errors import PiconeoxError


@dataclass(frozen=True)
class ModelConfig(ConfigBase):
    """The shape of a GPT-NeoX model.

    `vocab_size=None` means "size it from the dataset's tokenizer" (rounded up to `vocab_multiple`).
    `rotary_pct` is the fraction of each head's dims that RoPE rotates (GPT-NeoX's partial rotary);
    `head_dim * rotary_pct` must be an even integer >= 2, or position would not be encoded at all.
    """

    SECTION = "model"

    hidden_size: int
    """Width of the residual stream (d_model), in features: a whole number >= 1 that num_heads divides."""
    num_layers: int
    """Decoder layers (transformer blocks): a whole number >= 1."""
    num_heads: int
    """Attention heads per layer: a whole number >= 1 that divides hidden_size (head_dim = hidden_size / heads)."""
    intermediate_size: int
    """Width of each layer's MLP (GELU between two projections), in features: a whole number >= 1 (GPT-NeoX uses
    4 x hidden_size)."""
    max_position_embeddings: int
    """The longest sequence the model is built for, in tokens: a whole number >= 1; train.seq_len must fit in it
    (RoPE has no learned table of positions, but no run trains or generates past this)."""
    vocab_size: int | None = None
    """Rows of the embedding (and of the output head), in tokens: a whole number >= 2 and >= the tokenizer's size,
    or None to size it from the dataset's tokenizer, rounded up to vocab_multiple."""
    rotary_pct: float = 0.25
    """The share of each head's dims that RoPE rotates (GPT-NeoX's partial rotary), in (0, 1]; head_dim x rotary_pct
    must be an even whole number >= 2."""
    rotary_base: float = 10000.0
    """RoPE's base (theta): pair i of a head's rotary dims turns base^(-2i/dims) radians per position, so a larger
    base turns slower (longer contexts); a number > 0."""
    use_parallel_residual: bool = True
    """GPT-NeoX's parallel block (attention and MLP read the same input, x + attn(ln1 x) + mlp(ln2 x)); false: the
    sequential GPT-2 block."""
    tie_word_embeddings: bool = False
    """One matrix for the input embedding and the output head (saves vocab x hidden parameters; the Pico presets
    use it)."""
    layer_norm_eps: float = 1e-5
    """The epsilon added to the variance in every LayerNorm: a small number > 0, e.g. 1e-5."""
    dropout: float = 0.0
    """Dropout probability on the residual branches and the attention weights, in [0, 1) (0: off, as GPT-NeoX and
    Pythia train)."""
    vocab_multiple: int = 64
    """An unset vocab_size is rounded up to a multiple of this, in tokens (64: matmul-friendly shapes on GPUs): a
    whole number >= 1."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def rotary_dims(self) -> int:
        """What transformers computes: int(head_dim * partial_rotary_factor)."""
        return int(self.head_dim * self.rotary_pct)

    def validate(self) -> "ModelConfig":
        """Raise PiconeoxError (one line) for an impossible shape; return self."""
        self.check_ints(("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings",
                         "vocab_multiple"), 1)
        if self.vocab_size is not None and (not isinstance(self.vocab_size, int) or self.vocab_size < 2):
            raise PiconeoxError(f"model.vocab_size={self.vocab_size!r}: must be an integer >= 2 (or null to size it "
                                "from the tokenizer)")
        if self.hidden_size % self.num_heads:
            raise PiconeoxError(
                f"model.num_heads={self.num_heads} does not divide model.hidden_size={self.hidden_size}; "
                f"allowed head counts: {[h for h in range(1, self.hidden_size + 1) if self.hidden_size % h == 0]}"
            )
        if not 0.0 < self.rotary_pct <= 1.0:
            raise PiconeoxError(f"model.rotary_pct={self.rotary_pct}: must be in (0, 1]; GPT-NeoX has no other "
                                "position encoding")
        if self.rotary_dims < 2 or self.rotary_dims % 2:
            raise PiconeoxError(
                f"model.rotary_pct={self.rotary_pct} with head_dim {self.head_dim} gives {self.rotary_dims} "
                "rotary dims; "
                "RoPE needs an even number >= 2 (use fewer heads or a larger rotary_pct)"
            )
        self.check_float("dropout", lambda v: 0 <= v < 1, "in [0, 1)")
        self.check_float("rotary_base", lambda v: v > 0, "a number > 0")
        self.check_float("layer_norm_eps", lambda v: v > 0, "a small number > 0, e.g. 1e-5")
        return self

    def with_vocab(self, tokenizer_vocab: int) -> "ModelConfig":
        """Resolve `vocab_size` against the dataset's tokenizer; refuse a vocab that is too small."""
        if self.vocab_size is None:
            m = self.vocab_multiple
            return replace(self, vocab_size=(tokenizer_vocab + m - 1) // m * m)
        if self.vocab_size < tokenizer_vocab:
            raise PiconeoxError(
                f"model.vocab_size={self.vocab_size} is smaller than the dataset tokenizer's {tokenizer_vocab} tokens; "
                f"use a vocab_size >= {tokenizer_vocab} or a smaller tokenizer"
            )
        return self

    @classmethod
    def from_hf(cls, hf) -> "ModelConfig":
        """The shape of a transformers `GPTNeoXConfig` (e.g. a Pythia checkpoint's), validated."""
        rope = hf.rope_parameters or {}
        return cls(
            hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers, num_heads=hf.num_attention_heads,
            intermediate_size=hf.intermediate_size, max_position_embeddings=hf.max_position_embeddings,
            vocab_size=hf.vocab_size, rotary_pct=float(rope.get("partial_rotary_factor", 1.0)),
            rotary_base=float(rope.get("rope_theta", 10000.0)), use_parallel_residual=hf.use_parallel_residual,
            tie_word_embeddings=bool(hf.tie_word_embeddings), layer_norm_eps=hf.layer_norm_eps,
            dropout=float(hf.hidden_dropout), vocab_multiple=1,
        ).validate()

    def to_hf(self):
        """A fresh `GPTNeoXConfig` (transformers mutates the one a model is built from)."""
        from transformers import GPTNeoXConfig

        if self.vocab_size is None:
            raise PiconeoxError("model.vocab_size is unresolved; call with_vocab(tokenizer_vocab) first")
        return GPTNeoXConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_position_embeddings,
            rotary_pct=self.rotary_pct,
            rotary_emb_base=self.rotary_base,
            use_parallel_residual=self.use_parallel_residual,
            tie_word_embeddings=self.tie_word_embeddings,
            layer_norm_eps=self.layer_norm_eps,
            hidden_dropout=self.dropout,
            attention_dropout=self.dropout,
            hidden_act="gelu",
            use_cache=False,
            bos_token_id=None,
            eos_token_id=None,
        )


def build_model(cfg: ModelConfig, attn_implementation: str = "sdpa", shapes_only: bool = False):
    """A randomly initialised GPTNeoXForCausalLM of this shape (never a hub download).

    shapes_only: build on the meta device, then give each parameter uninitialised CPU storage that is never
    written (untouched pages cost no RAM) and keep the small buffers real: for FSDP ranks whose weights come
    from rank 0 in accelerator.prepare(). Distinct storages, unlike meta tensors, let accelerate map the
    optimizer's parameters onto their shards.
    """
    from transformers import GPTNeoXForCausalLM

    hf_config = cfg.validate().to_hf()
    if not shapes_only:
        return GPTNeoXForCausalLM._from_config(hf_config, attn_implementation=attn_implementation)
    import torch
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = GPTNeoXForCausalLM._from_config(hf_config, attn_implementation=attn_implementation)
    buffers = {name: b.clone() for name, b in model.named_buffers()}  # small and real (rotary frequencies)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    model.tie_weights()
    return model


def count_parameters(model) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


# RP2040 presets. The original seed used 8/8 and 12/12 heads (head_dim 1), where GPT-NeoX RoPE cannot
# encode position at all (STACK_NOTES.md). Heads do not change the parameter count, so these keep vocab,
# hidden, layers and intermediate and use head_dim 2 with rotary_pct 1.0 (2 rotary dims per head).
# Embeddings are tied: the embedding matrix is the largest tensor and a Pico has ~200 KB of heap.
RP2040_SPEED = ModelConfig(
    vocab_size=256, hidden_size=8, num_layers=2, num_heads=4, intermediate_size=192,
    max_position_embeddings=128, rotary_pct=1.0, tie_word_embeddings=True,
)
"""~9.2K params. 4 heads of dim 2 (rotary 1.0 -> 2 rotary dims); tied embeddings save 2K params of RAM."""

RP2040_OPTIMIZED = ModelConfig(
    vocab_size=512, hidden_size=8, num_layers=3, num_heads=4, intermediate_size=256,
    max_position_embeddings=128, rotary_pct=1.0, tie_word_embeddings=True,
)
"""~18K params. The seed's 8 heads gave head_dim 1 (no position at all); 4 heads give head_dim 2."""

RP2040_QUALITY = ModelConfig(
    vocab_size=1024, hidden_size=12, num_layers=4, num_heads=6, intermediate_size=384,
    max_position_embeddings=64, rotary_pct=1.0, tie_word_embeddings=True,
)
"""~53K params. The seed's 12 heads gave head_dim 1; 6 heads give head_dim 2. Context 64 keeps the
float KV cache (layers x ctx x hidden x 2 x 4 B = 24 KB) inside the Pico's heap next to the weights."""

PICO_BEST = ModelConfig(
    vocab_size=1024, hidden_size=28, num_layers=2, num_heads=2, intermediate_size=96,
    max_position_embeddings=64, rotary_pct=1.0, tie_word_embeddings=True,
)
"""~46K params, the winner of benchmarks/pico_search.py on TinyStories at vocab 1024: of 14 shapes whose int8
weights stay in RAM, width bought the most loss per emulated millisecond (the tied embedding is also the
output head), so two layers of two 14-dim heads and a 3.4x FFN, against rp2040-quality's 12 wide, 4 layers
and 32x FFN. int8 model.bin ~60 KB keeps ~108 KB of heap free, so no layer is streamed from flash."""

PICO_FAST = ModelConfig(
    vocab_size=512, hidden_size=24, num_layers=1, num_heads=2, intermediate_size=96,
    max_position_embeddings=128, rotary_pct=1.0, tie_word_embeddings=True,
)
"""~20K params, the fastest shape of benchmarks/pico_search.py at rp2040-optimized's vocab and context: one
layer, 24 wide with two 12-dim heads and a 4x FFN, against rp2040-optimized's 8 wide, 3 layers and 32x FFN.
Faster on the Pico than the other searched shapes and lower TinyStories val loss than the seed."""

PICO_LARGE = ModelConfig(
    vocab_size=1024, hidden_size=80, num_layers=2, num_heads=4, intermediate_size=224,
    max_position_embeddings=64, rotary_pct=1.0, tie_word_embeddings=True,
)
"""~207K params (4.5x pico-best), widened as benchmarks/pico_search.py found pays best: 80 wide, two layers of
four 20-dim heads, a 2.8x FFN. Its ~207 KB of int8 weights do not fit the Pico's heap next to the runtime, so
layers and the head stream from flash each token; the asm_thumb kernels keep it above 10 tok/s (docs/pico.md)."""

PICO_MILLION = ModelConfig(
    vocab_size=1024, hidden_size=160, num_layers=2, num_heads=8, intermediate_size=960,
    max_position_embeddings=64, rotary_pct=1.0, tie_word_embeddings=True,
)
"""988,160 params (983,040 in its matrices): pico-large's depth, vocab, context and 20-dim heads at twice its width
and a 6x FFN. Its 983 KB of int8 weights fit neither the heap nor the raw gap before littlefs, so the board reads
them in place from model.blk's littlefs blocks (rp2040/blockfile.py). Two layers and a wide FFN because the int16
KV cache (it grows with width x layers) and section P stay in the heap: three layers of 160 need ~212 KB of the
203 KB a Pico has free; and a 4-row group of fc_out (4 x 960 bytes) still fits one 4 KiB littlefs block."""

TEST = ModelConfig(
    hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512, max_position_embeddings=256,
)
"""~0.8-1M params with a byte-level vocab: fast enough for CPU tests, big enough to learn the demo corpus."""

SMALL = ModelConfig(
    hidden_size=320, num_layers=6, num_heads=5, intermediate_size=1280, max_position_embeddings=512,
)
"""~10M params (with an 8K BPE vocab): the CPU benchmark shape."""

PRODUCTION = ModelConfig(
    vocab_size=50304, hidden_size=2048, num_layers=24, num_heads=16, intermediate_size=8192,
    max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True,
)
"""GPT-NeoX 1.2B (the Pythia-1.4B shape: 1,414,647,808 params untied, 1.209B without embeddings)."""

SHAKESPEARE_CHAR = ModelConfig(
    hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512, max_position_embeddings=64,
    vocab_multiple=1,
)
"""nanoGPT's CPU recipe (n_layer 4, n_head 4, n_embd 128, block 64), vocab = the 65 distinct characters."""

CHAR_FAST = replace(SHAKESPEARE_CHAR, intermediate_size=128, rotary_pct=1.0)
"""Time to quality on CPU (benchmarks/README.md): SHAKESPEARE_CHAR's depth, width and heads with RoPE on all 32 dims
of each head (0.25 encodes position in only 8) and a 1x FFN (0.42M params, 1.5x cheaper steps). At one budget of
steps, depth and full RoPE bought more val loss than FFN width."""

MODEL_PRESETS: dict[str, ModelConfig] = {
    "rp2040-speed": RP2040_SPEED,
    "rp2040-optimized": RP2040_OPTIMIZED,
    "rp2040-quality": RP2040_QUALITY,
    "pico-fast": PICO_FAST,
    "pico-best": PICO_BEST,
    "pico-large": PICO_LARGE,
    "pico-million": PICO_MILLION,
    "test": TEST,
    "small": SMALL,
    "production": PRODUCTION,
    "shakespeare-char": SHAKESPEARE_CHAR,
    "shakespeare-char-fast": CHAR_FAST,
    "shakespeare-char-best": CHAR_FAST,
    "shakespeare-char-budget": CHAR_FAST,
}
