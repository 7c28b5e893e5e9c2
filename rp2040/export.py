"""Checkpoint -> models/<name>/{model.bin, vocab.bin, config.json}: the only writer of rp2040/FORMAT.md.

    python -m rp2040.export CHECKPOINT_OR_HF_DIR --out models/<name> [--dtype f32|int8]
        [--ram-budget-kb 180] [--min-free-kb 100] [--force]

Reads the shape from the checkpoint's config (never a preset), quantizes matrices to int8 with one
scale per row when asked, predicts the heap the runtime will use on the board from measurements of
the real firmware, keeps the weights in RAM only when that leaves --min-free-kb free (else the runtime
streams them from flash), and refuses a model over the budget unless --force. Files are written
atomically, and only after all checks pass.
"""
from __future__ import annotations

import math
import struct
import sys
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rp2040.runtime import fixed as fx
from rp2040.runtime import modelfile as mf
from rp2040.runtime import tokenizer as vf
from rp2040.runtime.gpt import buffer_bytes, plan_buffers
from rp2040.bundle import MODEL_FILES
from utils.atomic import atomic_write_json
from utils.ckpt.format import find_checkpoint
from utils.errors import CliParser, PiconeoxError, cli
from utils.atomic import atomic_dir, check_output_dir
from utils.diskfull import one_line_when_full
from utils.textfile import read_json

DEFAULT_RAM_BUDGET_KB = 180
DEFAULT_MIN_FREE_KB = 100
# Measured on MicroPython v1.28.0 for RPI_PICO (245,888-byte GC heap) with `python -m rp2040.emulate`
# (its probe prints both): the heap free once main.py has imported the runtime, and what loading a
# model and making its sampler take beyond the buffers (gpt.plan_buffers) and the bytes of vocab.bin
# (the tokenizer keeps about that much): array and object headers, GC block rounding, the sampler's
# tables. 5,160-5,290 bytes over the three presets. Re-measure when the runtime's code changes (the asm_thumb
# kernels' native code took about 900 bytes more of the heap).
BOARD_HEAP_FREE_BYTES = 206_828
LOAD_OVERHEAD_BYTES = 5_200
GENERATION_DEFAULTS = {"max_new_tokens": 64, "temperature": 0.8, "top_k": 40, "seed": 0}


@dataclass
class Shape:
    """The GPT-NeoX shape as the device sees it (everything the model.bin header carries)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    inter: int
    context: int
    rotary_dims: int
    norm_eps: float
    rotary_base: float
    tied: bool
    parallel_residual: bool

    @classmethod
    def from_hf(cls, config) -> "Shape":
        """Read a transformers GPTNeoXConfig; refuse what the runtime does not implement."""
        if config.model_type != "gpt_neox":
            raise PiconeoxError(f"model_type {config.model_type!r} is not supported; only gpt_neox exports to "
                                "the RP2040")
        if config.hidden_act != "gelu":
            raise PiconeoxError(f"hidden_act {config.hidden_act!r} is not supported by the runtime; only 'gelu' "
                                "(exact erf)")
        rope = config.rope_parameters or {}
        if rope.get("rope_type", "default") != "default":
            raise PiconeoxError(f"rope_type {rope.get('rope_type')!r} is not supported; only 'default'")
        head_dim = config.hidden_size // config.num_attention_heads
        rotary = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        if rotary < 2 or rotary % 2:
            raise PiconeoxError(f"{rotary} rotary dims per head: the runtime needs an even number >= 2")
        if config.vocab_size > 65535:
            raise PiconeoxError(f"vocab_size {config.vocab_size} is too large for the device format (at most 65535)")
        return cls(config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                   config.intermediate_size, config.max_position_embeddings, rotary, float(config.layer_norm_eps),
                   float(rope.get("rope_theta", 10000.0)), bool(config.tie_word_embeddings),
                   bool(config.use_parallel_residual))


def quantize_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 with one float32 scale per row: w[r] ~ q[r] * scale[r]."""
    w = w.astype(np.float32)
    amax = np.abs(w).max(axis=1)
    scale = (amax / 127.0).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / safe[:, None]), -127, 127).astype(np.int8)
    return q, scale


def _reorder_qkv(w: np.ndarray, heads: int) -> np.ndarray:
    """GPT-NeoX interleaves rows per head as (q, k, v); the file stores all q rows, then k, then v."""
    rest = w.shape[1:]
    return w.reshape(heads, 3, -1, *rest).swapaxes(0, 1).reshape(-1, *rest)


@dataclass
class Tensors:
    """A checkpoint's tensors grouped as model.bin stores them (numpy, QKV rows regrouped q|k|v)."""

    embedding: np.ndarray
    layer_params: list[list[np.ndarray]]  # per layer: ln1 w, b; ln2 w, b; qkv, dense, fc_in, fc_out biases
    layer_mats: list[list[np.ndarray]]  # per layer: qkv, dense, fc_in, fc_out weights
    final_norm: list[np.ndarray]  # weight, bias
    head: np.ndarray | None  # None when tied to the embedding


def model_tensors(state: dict, shape: Shape) -> Tensors:
    """The tensors of a GPTNeoXForCausalLM state_dict of numpy arrays, in file order."""
    d = shape.hidden

    def get(name, size=None):
        if name in state:
            return state[name]
        if size is not None:  # a bias the config switched off: the runtime adds zeros
            return np.zeros(size, np.float32)
        raise PiconeoxError(f"checkpoint is missing tensor {name!r}")

    layer_params, layer_mats = [], []
    for i in range(shape.layers):
        pre = f"gpt_neox.layers.{i}."
        layer_params.append([
            get(pre + "input_layernorm.weight"), get(pre + "input_layernorm.bias"),
            get(pre + "post_attention_layernorm.weight"), get(pre + "post_attention_layernorm.bias"),
            _reorder_qkv(get(pre + "attention.query_key_value.bias", 3 * d), shape.heads),
            get(pre + "attention.dense.bias", d), get(pre + "mlp.dense_h_to_4h.bias", shape.inter),
            get(pre + "mlp.dense_4h_to_h.bias", d)])
        layer_mats.append([_reorder_qkv(get(pre + "attention.query_key_value.weight"), shape.heads),
                           get(pre + "attention.dense.weight"), get(pre + "mlp.dense_h_to_4h.weight"),
                           get(pre + "mlp.dense_4h_to_h.weight")])
    final = [get("gpt_neox.final_layer_norm.weight"), get("gpt_neox.final_layer_norm.bias")]
    return Tensors(get("gpt_neox.embed_in.weight"), layer_params, layer_mats, final,
                   None if shape.tied else get("lm_head.weight"))


def multipliers(scale: np.ndarray) -> tuple[np.ndarray, int]:
    """Row scales as int32 multipliers and one shift: scale ~ M * 2**-S with |M| <= fixed.MULT_MAX."""
    top = float(np.abs(scale).max())
    if top == 0:
        return np.zeros(scale.shape, np.int64), 0
    shift = int(np.floor(np.log2(fx.MULT_MAX / top)))
    m = np.rint(scale.astype(np.float64) * 2.0 ** shift).astype(np.int64)
    while np.abs(m).max() > fx.MULT_MAX:  # log2 rounding at the boundary
        shift -= 1
        m = np.rint(scale.astype(np.float64) * 2.0 ** shift).astype(np.int64)
    return m, shift


def _q16(x: np.ndarray, what: str) -> np.ndarray:
    """Biases and norm offsets in the activation format (int / 2**16); refuses what int32 cannot hold."""
    q = np.rint(np.asarray(x, np.float64) * 2.0 ** fx.ACT_FRAC).astype(np.int64)
    if q.size and np.abs(q).max() >= 2 ** 30:
        raise PiconeoxError(f"{what} holds {np.abs(x).max():.4g}, beyond the int8 runtime's fixed-point range (2**14)")
    return q


def _gamma(w: np.ndarray, what: str) -> tuple[np.ndarray, int]:
    """A LayerNorm weight as int * 2**-S with |int| <= fixed.GAMMA_MAX and S >= 4 (the norm's output shift)."""
    top = float(np.abs(w).max())
    shift = 30 if top == 0 else min(30, int(np.floor(np.log2(fx.GAMMA_MAX / top))))
    if shift < 4:
        raise PiconeoxError(f"{what} weight reaches {top:.4g}; the int8 runtime allows at most {fx.GAMMA_MAX / 16:.0f}")
    g = np.rint(np.asarray(w, np.float64) * 2.0 ** shift).astype(np.int64)
    return np.clip(g, -fx.GAMMA_MAX, fx.GAMMA_MAX), shift


def constant_tables(shape: Shape) -> list[np.ndarray]:
    """GELU table and rotary cos/sin of an int8 model (FORMAT.md), computed once, here."""
    x = fx.GELU_LO + np.arange(fx.GELU_N, dtype=np.float64) / 64
    gelu = np.rint([0.5 * v * (1 + math.erf(v / math.sqrt(2))) * 2.0 ** fx.ACT_FRAC for v in x])
    half = shape.rotary_dims // 2
    inv_freq = 1.0 / shape.rotary_base ** (np.arange(half, dtype=np.float64) * 2 / shape.rotary_dims)
    angle = np.arange(shape.context, dtype=np.float64)[:, None] * inv_freq[None, :]
    unit = 2.0 ** fx.ROPE_FRAC
    return [gelu, np.rint(np.cos(angle) * unit).ravel(), np.rint(np.sin(angle) * unit).ravel()]


def integer_params(t: Tensors, shape: Shape) -> tuple[np.ndarray, list[np.ndarray]]:
    """(section P as int32, the int8 matrices in W order) of an int8 model (FORMAT.md).

    The q rows of query_key_value carry 1/sqrt(head_dim) in their scales and biases, so attention
    scores need no extra multiply.
    """
    d = shape.hidden
    q_scale = 1.0 / np.sqrt(d // shape.heads)
    params, mats = [], []
    emb_q, emb_s = quantize_rows(t.embedding)
    mats.append(emb_q)
    for i, (p, m) in enumerate(zip(t.layer_params, t.layer_mats)):
        ln1_g, ln1_s = _gamma(p[0], f"layer {i} input_layernorm")
        ln2_g, ln2_s = _gamma(p[2], f"layer {i} post_attention_layernorm")
        biases = [np.asarray(b, np.float64) for b in p[4:8]]
        biases[0] = np.concatenate([biases[0][:d] * q_scale, biases[0][d:]])
        rows, shifts = [], [ln1_s, ln2_s]
        for j, w in enumerate(m):
            q, s = quantize_rows(w)
            if j == 0:
                s = np.concatenate([s[:d] * np.float32(q_scale), s[d:]])
            mult, shift = multipliers(s)
            mats.append(q)
            rows.append(mult)
            shifts.append(shift)
        params += [ln1_g, _q16(p[1], f"layer {i} input_layernorm bias"), ln2_g,
                   _q16(p[3], f"layer {i} post_attention_layernorm bias")]
        params += [_q16(b, f"layer {i} bias") for b in biases] + rows + [np.array(shifts)]
    final_g, final_s = _gamma(t.final_norm[0], "final_layer_norm")
    params += [final_g, _q16(t.final_norm[1], "final_layer_norm bias")]
    emb_m, emb_shift = multipliers(emb_s)
    params.append(emb_m)
    head_shift = emb_shift
    if t.head is not None:
        head_q, head_s = quantize_rows(t.head)
        head_m, head_shift = multipliers(head_s)
        params.append(head_m)
    eps = min(int(round(shape.norm_eps * 2.0 ** 32)), 2 ** 30 - 1)
    params.append(np.array([final_s, emb_shift, head_shift, eps]))
    params += constant_tables(shape)
    if t.head is not None:
        mats.append(head_q)
    return np.concatenate([np.asarray(x, np.int64).ravel() for x in params]).astype("<i4"), mats


def encode_model(state: dict, shape: Shape, dtype: str) -> bytes:
    """The bytes of model.bin (FORMAT.md): P = per-layer blocks, final norm, [int8: multipliers, constants];
    W = matrices."""
    t = model_tensors(state, shape)
    if dtype == "int8":
        p, mats = integer_params(t, shape)
    else:
        p = np.concatenate([np.asarray(x, np.float32).ravel() for x in sum(t.layer_params, []) + t.final_norm])
        p = p.astype("<f4")
        mats = [t.embedding] + sum(t.layer_mats, []) + ([t.head] if t.head is not None else [])
    w = np.concatenate([np.asarray(m).ravel() for m in mats]).astype("i1" if dtype == "int8" else "<f4")
    flags = (mf.FLAG_TIED if shape.tied else 0) | (mf.FLAG_PARALLEL_RESIDUAL if shape.parallel_residual else 0)
    header = struct.pack(mf.HEADER_FORMAT, mf.MAGIC, mf.VERSION, mf.DTYPE_NAMES.index(dtype), flags,
                         shape.vocab, shape.hidden, shape.layers, shape.heads, shape.inter, shape.context,
                         shape.rotary_dims, p.size, w.nbytes, shape.norm_eps, shape.rotary_base)
    body = header.ljust(mf.HEADER_SIZE, b"\0") + p.tobytes() + w.tobytes()
    body += b"\0" * (-len(body) % 4)
    return body + struct.pack("<I", zlib.crc32(body))


# ---------------------------------------------------------------- vocab.bin

def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


@dataclass
class Vocab:
    """What the device needs from tokenizer.json: raw bytes per id, specials, merges, pre-tokenizer flags."""

    kind: str  # "byte", "char" or "bpe"
    tokens: list[bytes]
    special: list[bool]
    merges: list[tuple[int, int, int]]  # (left, right, merged) in rank order
    eos: int
    unk: int
    prefix_space: bool
    split: bool

    @classmethod
    def from_tokenizer_json(cls, path: Path, model_vocab: int) -> "Vocab":
        tj = read_json(path, "the tokenizer")
        model = tj.get("model") or {}
        if model.get("type") not in ("BPE", "WordLevel"):
            raise PiconeoxError(f"{path}: tokenizer model {model.get('type')!r} is not supported; allowed: BPE, "
                                "WordLevel")
        pre = tj.get("pre_tokenizer")
        if pre is not None and pre.get("type") != "ByteLevel":
            raise PiconeoxError(f"{path}: pre_tokenizer {pre.get('type')!r} is not supported; allowed: ByteLevel "
                                "or none")
        if tj.get("normalizer") is not None:
            raise PiconeoxError(f"{path}: a normalizer ({tj['normalizer'].get('type')}) is not supported on the device")
        byte_level = pre is not None
        vocab: dict[str, int] = dict(model["vocab"])
        special = {t["id"]: t["content"] for t in tj.get("added_tokens", []) if t.get("special")}
        for t in tj.get("added_tokens", []):
            vocab[t["content"]] = t["id"]
        size = max(vocab.values()) + 1
        if size > model_vocab:
            raise PiconeoxError(f"{path} has {size} tokens but the model's vocab is {model_vocab}")
        tokens, is_special = [b""] * model_vocab, [True] * model_vocab  # ids the tokenizer never makes: empty
        u2b = _unicode_to_byte()
        for text, i in vocab.items():
            if i in special:
                tokens[i] = text.encode("utf-8")
                continue
            tokens[i] = bytes(u2b[c] for c in text) if byte_level else text.encode("utf-8")
            is_special[i] = False
        merges = []
        for m in model.get("merges") or []:
            a, b = m.split(" ") if isinstance(m, str) else m
            merges.append((vocab[a], vocab[b], vocab[a + b]))
        kind = "bpe" if merges else "byte" if byte_level else "char"
        eos = next((i for i, c in special.items() if c == "<|endoftext|>"), -1)
        unk_token = model.get("unk_token")
        return cls(kind, tokens, is_special, merges, eos, vocab.get(unk_token, -1) if unk_token else -1,
                   bool(pre and pre.get("add_prefix_space")), bool(pre and pre.get("use_regex", True)))

    def encode(self) -> bytes:
        """The bytes of vocab.bin (FORMAT.md)."""
        n = len(self.tokens)
        blob = b"".join(self.tokens)
        offsets = np.cumsum([0] + [len(t) for t in self.tokens]).astype("<u4")
        flags = (vf.FLAG_PREFIX_SPACE if self.prefix_space else 0) | (vf.FLAG_SPLIT if self.split else 0)
        out = struct.pack("<4sHBBIIiiI", vf.MAGIC, vf.VERSION, vf.KINDS.index(self.kind), flags, n,
                          len(self.merges), self.eos, self.unk, len(blob)).ljust(vf.HEADER_SIZE, b"\0")
        out += offsets.tobytes() + blob + bytes(self.special)
        out += b"\0" * (-len(out) % 4)
        out += np.asarray(self.merges, "<u2").reshape(-1).tobytes()
        out += b"\0" * (-len(out) % 4)
        return out + struct.pack("<I", zlib.crc32(out))


# ---------------------------------------------------------------- RAM estimate and CLI

def ram_estimate(model_bin: bytes, vocab_bin: bytes, stream: bool) -> int:
    """Bytes of heap loading the model takes on the board: planned buffers + tokenizer + measured overhead."""
    header = mf.Header(model_bin[:mf.HEADER_SIZE])
    layout = mf.Layout(header)
    return buffer_bytes(plan_buffers(header, layout, stream)) + len(vocab_bin) + LOAD_OVERHEAD_BYTES


def export(checkpoint: Path, out: Path, dtype: str = "int8", ram_budget_kb: int = DEFAULT_RAM_BUDGET_KB,
           force: bool = False, min_free_kb: int = DEFAULT_MIN_FREE_KB) -> dict:
    """Export a checkpoint; returns the config.json written. Raises PiconeoxError (nothing written) on refusal."""
    if dtype not in mf.DTYPE_NAMES:
        raise PiconeoxError(f"--dtype {dtype!r} is not allowed; use one of {', '.join(mf.DTYPE_NAMES)}")
    if ram_budget_kb <= 0:
        raise PiconeoxError(f"--ram-budget-kb {ram_budget_kb} must be a positive number of KB")
    if min_free_kb < 0:
        raise PiconeoxError(f"--min-free-kb {min_free_kb} must be >= 0")
    check_output_dir(out, "--out", is_export, "an exported model")
    src = find_checkpoint(checkpoint)
    if not (src / "tokenizer.json").is_file():
        raise PiconeoxError(f"{src} has no tokenizer.json: the device needs it to encode and decode text")
    from transformers.utils import logging as hf_logging

    from utils.ckpt.hf_folder import tokenizer_problem
    from utils.ckpt.load import load_model  # heavy: only once the arguments are known good

    hf_logging.disable_progress_bar()  # a 1-second load needs no bar; stderr stays one line on error
    model = load_model(src)  # checked against the marker's crc32c when there is one
    shape = Shape.from_hf(model.config)
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    model_bin = encode_model(state, shape, dtype)
    if why := tokenizer_problem(src / "tokenizer.json", shape.vocab):  # bounded before it is parsed whole
        raise PiconeoxError(why)
    vocab = Vocab.from_tokenizer_json(src / "tokenizer.json", shape.vocab)
    vocab_bin = vocab.encode()
    budget = ram_budget_kb * 1024
    in_ram, streamed = ram_estimate(model_bin, vocab_bin, False), ram_estimate(model_bin, vocab_bin, True)
    # Weights in RAM only while the board keeps --min-free-kb of its measured heap after loading.
    stream = BOARD_HEAP_FREE_BYTES - in_ram < min_free_kb * 1024
    estimate = streamed if stream else in_ram
    if estimate > min(budget, BOARD_HEAP_FREE_BYTES) and not force:
        raise PiconeoxError(f"{src.name} as {dtype} needs about {estimate // 1024} KB of heap "
                            f"(even streaming layers from flash), over the {ram_budget_kb} KB budget or the "
                            f"{BOARD_HEAP_FREE_BYTES // 1024} KB a Pico has free; use "
                            f"{'' if dtype == 'int8' else '--dtype int8, '}a smaller model, --ram-budget-kb, "
                            "or --force")
    config = {
        "format": {"model.bin": mf.VERSION, "vocab.bin": vf.VERSION},
        "source": str(src),
        "dtype": dtype,
        "shape": asdict(shape),
        "tokenizer": {"kind": vocab.kind, "eos": vocab.eos},
        "files": {"model.bin": len(model_bin), "vocab.bin": len(vocab_bin)},
        "ram": {"estimate_bytes": estimate, "in_ram_bytes": in_ram, "streamed_bytes": streamed,
                "budget_bytes": budget, "board_heap_free_bytes": BOARD_HEAP_FREE_BYTES,
                "free_after_load_bytes": BOARD_HEAP_FREE_BYTES - estimate, "min_free_bytes": min_free_kb * 1024},
        "runtime": {"stream": stream},
        "generation": GENERATION_DEFAULTS,
    }
    with one_line_when_full(Path(out).absolute().parent, f"exported model {Path(out).name}",
                            len(model_bin) + len(vocab_bin)), atomic_dir(out) as tmp:
        (tmp / "model.bin").write_bytes(model_bin)
        (tmp / "vocab.bin").write_bytes(vocab_bin)
        atomic_write_json(tmp / "config.json", config)
    return config


def is_export(folder: Path) -> bool:
    """True for a folder this exporter wrote (only model files, config.json with a "format"): --out may replace it."""
    try:
        config = read_json(folder / "config.json")
    except PiconeoxError:
        return False
    return isinstance(config, dict) and "format" in config and {p.name for p in folder.iterdir()} <= set(MODEL_FILES)


@cli
def main(argv: list[str] | None = None) -> int:
    ap = CliParser(prog="python -m rp2040.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="HF model dir, checkpoints/<run>/step-N/, or checkpoints/<run>/")
    ap.add_argument("--out", type=Path, required=True, help="output dir, e.g. models/<name> "
                    "(new, empty, or an earlier export)")
    ap.add_argument("--dtype", default="int8", help="f32 or int8 (default int8)")
    ap.add_argument("--ram-budget-kb", type=int, default=DEFAULT_RAM_BUDGET_KB,
                    help=f"refuse models whose estimated heap exceeds this (default {DEFAULT_RAM_BUDGET_KB})")
    ap.add_argument("--min-free-kb", type=int, default=DEFAULT_MIN_FREE_KB,
                    help="keep the weights in RAM only if the Pico keeps this much heap free after loading; "
                         f"else stream them from flash (default {DEFAULT_MIN_FREE_KB})")
    ap.add_argument("--force", action="store_true", help="export even when over the RAM budget")
    args = ap.parse_args(argv)
    cfg = export(args.checkpoint, args.out, args.dtype, args.ram_budget_kb, args.force, args.min_free_kb)
    ram = cfg["ram"]
    for name, size in cfg["files"].items():
        print(f"{args.out / name}: {size:,} bytes")
    print(f"estimated RAM: {ram['estimate_bytes'] / 1024:.1f} KB of {ram['budget_bytes'] // 1024} KB budget "
          f"({'streaming layers from flash' if cfg['runtime']['stream'] else 'all weights in RAM'}; "
          f"in RAM {ram['in_ram_bytes'] / 1024:.1f} KB, streamed {ram['streamed_bytes'] / 1024:.1f} KB); "
          f"heap free after load on a Pico: about {ram['free_after_load_bytes'] / 1024:.1f} KB")
    if ram["estimate_bytes"] > ram["budget_bytes"]:
        print("warning: over the RAM budget (--force)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
