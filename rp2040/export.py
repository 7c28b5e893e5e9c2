"""Checkpoint -> models/<name>/{model.bin, vocab.bin, config.json}: the only writer of rp2040/FORMAT.md.

    python -m rp2040.export CHECKPOINT_OR_HF_DIR --out models/<name> [--dtype f32|int8]
        [--ram-budget-kb 180] [--force]

Reads the shape from the checkpoint's config (never a preset), quantizes matrices to int8 with one
scale per row when asked, estimates the RAM the runtime will allocate on the board, and refuses a
model over the budget unless --force. Files are written atomically, and only after all checks pass.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rp2040.runtime import modelfile as mf
from rp2040.runtime import tokenizer as vf
from rp2040.runtime.gpt import buffer_bytes, plan_buffers
from utils.atomic import atomic_write, atomic_write_json
from utils.errors import PiconeoxError

DEFAULT_RAM_BUDGET_KB = 180
# Heap the runtime needs besides its planned buffers: the imported modules' bytecode and objects,
# the open file, and the garbage of one token. Measured in the WebAssembly port (bench_rp2040.py).
RUNTIME_OVERHEAD_BYTES = 24 * 1024
# Weights stay in RAM only while that keeps the estimate under this; above it the runtime streams
# each layer from flash. A step's flash read costs little next to its arithmetic (bench_rp2040.py
# measures both modes), and the heap left over is headroom against fragmentation.
RESIDENT_LIMIT_BYTES = 100 * 1024
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
            raise PiconeoxError(f"model_type {config.model_type!r} is not supported; only gpt_neox exports to the RP2040")
        if config.hidden_act != "gelu":
            raise PiconeoxError(f"hidden_act {config.hidden_act!r} is not supported by the runtime; only 'gelu' (exact erf)")
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


def resolve_checkpoint(path: Path) -> Path:
    """The model folder inside what the user named: an HF dir, a step folder, or a run dir (best/ or final/)."""
    if not path.is_dir():
        raise PiconeoxError(f"checkpoint {path} is not a directory")
    step = path.name.startswith("step-")
    if step and not (path / "COMPLETE").exists():
        raise PiconeoxError(f"{path} has no COMPLETE marker: it was not fully written; pick a completed step")
    if (path / "config.json").is_file() and ((path / "model.safetensors").is_file() or (path / ".metadata").is_file()):
        return path
    for sub in ("best", "final"):
        if (path / sub / "config.json").is_file():
            return path / sub
    raise PiconeoxError(f"{path} holds no model: expected config.json + model.safetensors, or a run dir with best/ or final/")


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


def encode_model(state: dict, shape: Shape, dtype: str) -> bytes:
    """The bytes of model.bin (FORMAT.md): P = per-layer blocks, final norm, [embedding/head scales]; W = matrices."""
    t = model_tensors(state, shape)
    int8 = dtype == "int8"
    tops = [t.embedding] + ([t.head] if t.head is not None else [])  # the matrices outside the layers
    top_pairs = [quantize_rows(m) if int8 else (m, None) for m in tops]
    params, mats = [], [top_pairs[0][0]]
    for p, m in zip(t.layer_params, t.layer_mats):
        pairs = [quantize_rows(w) if int8 else (w, None) for w in m]
        params += p + ([s for _, s in pairs] if int8 else [])
        mats += [q for q, _ in pairs]
    params += t.final_norm + ([s for _, s in top_pairs] if int8 else [])
    mats += [q for q, _ in top_pairs[1:]]
    p = np.concatenate([np.asarray(x, np.float32).ravel() for x in params]).astype("<f4")
    w = np.concatenate([np.asarray(m).ravel() for m in mats]).astype("i1" if dtype == "int8" else "<f4")
    flags = (mf.FLAG_TIED if shape.tied else 0) | (mf.FLAG_PARALLEL_RESIDUAL if shape.parallel_residual else 0)
    header = struct.pack(mf.HEADER_FORMAT, mf.MAGIC, mf.VERSION, mf.DTYPE_NAMES.index(dtype), flags,
                         shape.vocab, shape.hidden, shape.layers, shape.heads, shape.inter, shape.context,
                         shape.rotary_dims, p.size, w.nbytes, shape.norm_eps, shape.rotary_base)
    body = header.ljust(mf.HEADER_SIZE, b"\0") + p.tobytes() + w.tobytes()
    body += b"\0" * (-len(body) % 4)
    return body + struct.pack("<I", zlib.crc32(body))


def dequantized_state(state: dict, shape: Shape) -> dict:
    """The state_dict a PyTorch model needs to compute exactly what the int8 file holds (for parity checks)."""
    names = ["gpt_neox.embed_in.weight"] + [
        f"gpt_neox.layers.{i}.{n}" for i in range(shape.layers)
        for n in ("attention.query_key_value.weight", "attention.dense.weight",
                  "mlp.dense_h_to_4h.weight", "mlp.dense_4h_to_h.weight")]
    if not shape.tied:
        names.append("lm_head.weight")
    out = dict(state)
    for name in names:
        q, s = quantize_rows(state[name])
        out[name] = q.astype(np.float32) * s[:, None]
    if shape.tied:
        out["lm_head.weight"] = out["gpt_neox.embed_in.weight"]
    return out


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
        tj = json.loads(path.read_text(encoding="utf-8"))
        model = tj.get("model") or {}
        if model.get("type") not in ("BPE", "WordLevel"):
            raise PiconeoxError(f"{path}: tokenizer model {model.get('type')!r} is not supported; allowed: BPE, WordLevel")
        pre = tj.get("pre_tokenizer")
        if pre is not None and pre.get("type") != "ByteLevel":
            raise PiconeoxError(f"{path}: pre_tokenizer {pre.get('type')!r} is not supported; allowed: ByteLevel or none")
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
    """Bytes of heap the runtime allocates on the board: planned buffers + vocab + fixed overhead."""
    header = mf.Header(model_bin[:mf.HEADER_SIZE])
    layout = mf.Layout(header)
    # The tokenizer reads vocab.bin whole and keeps slices of it: about twice its size while loading.
    return buffer_bytes(plan_buffers(header, layout, stream)) + 2 * len(vocab_bin) + RUNTIME_OVERHEAD_BYTES


def export(checkpoint: Path, out: Path, dtype: str = "int8", ram_budget_kb: int = DEFAULT_RAM_BUDGET_KB,
           force: bool = False) -> dict:
    """Export a checkpoint; returns the config.json written. Raises PiconeoxError (nothing written) on refusal."""
    if dtype not in mf.DTYPE_NAMES:
        raise PiconeoxError(f"--dtype {dtype!r} is not allowed; use one of {', '.join(mf.DTYPE_NAMES)}")
    if ram_budget_kb <= 0:
        raise PiconeoxError(f"--ram-budget-kb {ram_budget_kb} must be a positive number of KB")
    src = resolve_checkpoint(Path(checkpoint))
    if not (src / "tokenizer.json").is_file():
        raise PiconeoxError(f"{src} has no tokenizer.json: the device needs it to encode and decode text")
    from transformers.utils import logging as hf_logging

    from utils.consolidate import load_model  # heavy: only once the arguments are known good

    hf_logging.disable_progress_bar()  # a 1-second load needs no bar; stderr stays one line on error
    model = load_model(src)  # checked against the marker's crc32c when there is one
    shape = Shape.from_hf(model.config)
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    model_bin = encode_model(state, shape, dtype)
    vocab = Vocab.from_tokenizer_json(src / "tokenizer.json", shape.vocab)
    vocab_bin = vocab.encode()
    budget = ram_budget_kb * 1024
    in_ram, streamed = ram_estimate(model_bin, vocab_bin, False), ram_estimate(model_bin, vocab_bin, True)
    stream = in_ram > min(budget, RESIDENT_LIMIT_BYTES)
    estimate = streamed if stream else in_ram
    if estimate > budget and not force:
        raise PiconeoxError(f"{src.name} as {dtype} needs about {estimate // 1024} KB of RAM "
                            f"(even streaming layers from flash), over the {ram_budget_kb} KB budget; "
                            "use --dtype int8, a smaller model, --ram-budget-kb, or --force")
    config = {
        "format": {"model.bin": mf.VERSION, "vocab.bin": vf.VERSION},
        "source": str(src),
        "dtype": dtype,
        "shape": asdict(shape),
        "tokenizer": {"kind": vocab.kind, "eos": vocab.eos},
        "files": {"model.bin": len(model_bin), "vocab.bin": len(vocab_bin)},
        "ram": {"estimate_bytes": estimate, "in_ram_bytes": in_ram, "streamed_bytes": streamed, "budget_bytes": budget},
        "runtime": {"stream": stream},
        "generation": GENERATION_DEFAULTS,
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (("model.bin", model_bin), ("vocab.bin", vocab_bin)):
        with atomic_write(out / name) as f:
            f.write(data)
    atomic_write_json(out / "config.json", config)
    return config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rp2040.export", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path, help="HF model dir, checkpoints/<run>/step-N/, or checkpoints/<run>/")
    ap.add_argument("--out", type=Path, required=True, help="output dir, e.g. models/<name>")
    ap.add_argument("--dtype", default="int8", help="f32 or int8 (default int8)")
    ap.add_argument("--ram-budget-kb", type=int, default=DEFAULT_RAM_BUDGET_KB,
                    help=f"refuse models whose estimated heap exceeds this (default {DEFAULT_RAM_BUDGET_KB})")
    ap.add_argument("--force", action="store_true", help="export even when over the RAM budget")
    args = ap.parse_args(argv)
    try:
        cfg = export(args.checkpoint, args.out, args.dtype, args.ram_budget_kb, args.force)
    except PiconeoxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ram = cfg["ram"]
    for name, size in cfg["files"].items():
        print(f"{args.out / name}: {size:,} bytes")
    print(f"estimated RAM: {ram['estimate_bytes'] / 1024:.1f} KB of {ram['budget_bytes'] // 1024} KB budget "
          f"({'streaming layers from flash' if cfg['runtime']['stream'] else 'all weights in RAM'}; "
          f"in RAM {ram['in_ram_bytes'] / 1024:.1f} KB, streamed {ram['streamed_bytes'] / 1024:.1f} KB)")
    if ram["estimate_bytes"] > ram["budget_bytes"]:
        print("warning: over the RAM budget (--force)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
