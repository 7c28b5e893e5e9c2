"""A checkpoint's weights as the bytes of model.bin (rp2040/FORMAT.md): the shape the device sees, int8 rows with
one scale each, the fixed-point multipliers, norms and tables of the integer runtime, or plain f32."""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from rp2040.runtime import fixed as fx
from rp2040.runtime import modelfile as mf
from utils.errors import PiconeoxError


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


def interleavable(n_out: int, n_in: int) -> bool:
    """Whether model.bin v4 stores an int8 [n_out, n_in] matrix 4 rows interleaved (the asm kernel's blocks)."""
    return n_out % 4 == 0 and n_in % 8 == 0 and n_out > 0 and n_in > 0


def interleave(q: np.ndarray) -> bytes:
    """An int8 [n_out, n_in] matrix (n_out % 4 == 0) as v4's blocks of 4 rows: word i of block b holds rows
    4b..4b+3 at column i (row 4b+r in byte r), each byte q + 128 (FORMAT.md)."""
    n_out, n_in = q.shape
    u = (q.astype(np.int16) + 128).astype(np.uint8)
    return u.reshape(n_out // 4, 4, n_in).transpose(0, 2, 1).tobytes()


def deinterleave(blocks: np.ndarray, n_out: int, n_in: int) -> np.ndarray:
    """interleave's inverse: the int8 [n_out, n_in] matrix of v4 blocks (bytes as uint8 or int8)."""
    u = np.asarray(blocks).view(np.uint8).reshape(n_out // 4, n_in, 4).transpose(0, 2, 1).reshape(n_out, n_in)
    return (u.astype(np.int16) - 128).astype(np.int8)


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
    if dtype == "int8":  # v4: each matrix 4-row interleaved where it fits, padded to a multiple of 4 bytes
        parts = [interleave(m) if interleavable(*m.shape) else m.astype("i1").tobytes() for m in mats]
        w = np.frombuffer(b"".join(p + b"\0" * (-len(p) % 4) for p in parts), "i1")
    else:
        w = np.concatenate([np.asarray(m).ravel() for m in mats]).astype("<f4")
    flags = (mf.FLAG_TIED if shape.tied else 0) | (mf.FLAG_PARALLEL_RESIDUAL if shape.parallel_residual else 0)
    header = struct.pack(mf.HEADER_FORMAT, mf.MAGIC, mf.VERSION, mf.DTYPE_NAMES.index(dtype), flags,
                         shape.vocab, shape.hidden, shape.layers, shape.heads, shape.inter, shape.context,
                         shape.rotary_dims, p.size, w.nbytes, shape.norm_eps, shape.rotary_base)
    body = header.ljust(mf.HEADER_SIZE, b"\0") + p.tobytes() + w.tobytes()
    body += b"\0" * (-len(body) % 4)
    return body + struct.pack("<I", zlib.crc32(body))
