"""A checkpoint as one GGUF file (architecture gptneox) that llama.cpp, ollama and LM Studio run unpatched.

Written with the `gguf` library, not llama.cpp's converter: that converter knows only published tokenizers
(every model trained here has its own) and reads only the legacy rotary keys. What llama.cpp needs, per
tokenizer kind (utils.data.tokenizers):
- bpe and byte: the token texts are already GPT-2 byte-level strings; pre-tokenizer `gpt-2`, the BPE merges.
- char: HF has no pre-tokenizer and one token per character, so each text is written byte-level encoded
  (a raw " " would never match) and a multi-byte character gets the merges that join its bytes.
llama.cpp refuses an empty merge list, so a merge that cannot fire (two 0xFF bytes, never in UTF-8) stands in.
The end-of-text token is bos/eos/unk (Pythia's convention) and nothing is added to a prompt, like the HF side.
Rope theta and the rotary dimension count are written explicitly, so no default can replace them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from utils.errors import PiconeoxError
from utils.data.tokenizers import EOT, byte_to_unicode, tokenizer_kind

OUT_TYPES = ("f32", "f16", "q8_0")
NEVER_MERGE = "ÿ ÿ"  # byte-level 0xFF twice: no UTF-8 text contains it
PRE_TOKENIZER = "gpt-2"


def check_expressible(config) -> None:
    """Refuse, in one line, a model llama.cpp's gptneox graph would run differently."""
    rope = config.rope_parameters or {}
    if config.hidden_act != "gelu":
        raise PiconeoxError(f"hidden_act {config.hidden_act!r}: llama.cpp's gptneox runs only 'gelu'")
    if rope.get("rope_type", "default") != "default":
        raise PiconeoxError(f"rope_type {rope['rope_type']!r}: GGUF export supports only the default (unscaled) RoPE")
    if not getattr(config, "attention_bias", True):
        raise PiconeoxError("attention_bias false: llama.cpp's gptneox needs the attention biases")


def token_texts(tok) -> tuple[list[str], list[int], list[str]]:
    """(texts, gguf token types, merges) of a tokenizers.Tokenizer, as llama.cpp's BPE tokenizer reads them."""
    import gguf

    spec = json.loads(tok.to_str())
    pre = spec.get("pre_tokenizer") or {}
    kind = tokenizer_kind(tok)
    byte_level = pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")
    if spec["model"]["type"] != "BPE" or spec.get("normalizer") or not (byte_level or (kind == "char" and not pre)):
        raise PiconeoxError("the tokenizer is not one GGUF can express as GPT-2 byte-level BPE (it has a "
                            "normalizer, another model type or pre-tokenizer); use a char, byte or bpe tokenizer")
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    table = byte_to_unicode()
    texts, types, merges = [], [], []
    for text, _ in sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1]):
        if text in specials:
            texts.append(text)
            types.append(gguf.TokenType.CONTROL)
            continue
        if kind == "char":
            pieces = [table[b] for b in text.encode("utf-8")]
            merges += [f"{''.join(pieces[:i])} {pieces[i]}" for i in range(1, len(pieces))]
            text = "".join(pieces)
        texts.append(text)
        types.append(gguf.TokenType.NORMAL)
    if kind != "char":
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    if len(texts) != tok.get_vocab_size(with_added_tokens=True):
        raise PiconeoxError("the tokenizer's ids are not contiguous: GGUF needs one token text per id")
    return texts, types, list(dict.fromkeys(merges)) or [NEVER_MERGE]


def add_vocab(writer, tok, n_vocab: int) -> None:
    """Tokenizer metadata; ids the model has beyond the tokenizer's (vocab padding) become unused tokens."""
    import gguf

    texts, types, merges = token_texts(tok)
    if len(texts) > n_vocab:
        raise PiconeoxError(f"the tokenizer has {len(texts)} tokens but the model only {n_vocab} embeddings")
    texts += [f"[PAD{i}]" for i in range(len(texts), n_vocab)]
    types += [gguf.TokenType.UNUSED] * (n_vocab - len(types))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(texts)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eot = tok.token_to_id(EOT)
    for add in (writer.add_bos_token_id, writer.add_eos_token_id, writer.add_unk_token_id):
        add(eot)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)


def gguf_tensors(model):
    """(gguf name, float32 array) for every weight, in llama.cpp's gptneox names and layouts."""
    cfg = model.config
    heads, hidden = cfg.num_attention_heads, cfg.hidden_size
    base = model.gpt_neox

    def qkv(t):  # HF interleaves per head [head, (q, k, v), head_dim]; llama.cpp wants all q, all k, all v
        return t.reshape(heads, 3, hidden // heads, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    yield "token_embd.weight", base.embed_in.weight
    for i, layer in enumerate(base.layers):
        parts = {"attn_norm": layer.input_layernorm, "attn_qkv": layer.attention.query_key_value,
                 "attn_output": layer.attention.dense, "ffn_norm": layer.post_attention_layernorm,
                 "ffn_up": layer.mlp.dense_h_to_4h, "ffn_down": layer.mlp.dense_4h_to_h}
        for name, module in parts.items():
            for kind in ("weight", "bias"):
                t = getattr(module, kind)
                yield f"blk.{i}.{name}.{kind}", qkv(t) if name == "attn_qkv" else t
    yield "output_norm.weight", base.final_layer_norm.weight
    yield "output_norm.bias", base.final_layer_norm.bias
    yield "output.weight", model.get_output_embeddings().weight  # written even when tied: llama.cpp needs it


def encode(array: np.ndarray, out_type: str):
    """(data, ggml type) of one tensor: 1-D stays f32 (llama.cpp norms and biases), rows that q8_0's blocks of
    32 do not divide fall back to f16, as llama.cpp's own converter does."""
    import gguf

    Q = gguf.GGMLQuantizationType
    if array.ndim == 1 or out_type == "f32":
        return array, Q.F32
    if out_type == "q8_0" and array.shape[-1] % gguf.GGML_QUANT_SIZES[Q.Q8_0][0] == 0:
        return gguf.quants.quantize(array, Q.Q8_0), Q.Q8_0
    return array.astype(np.float16), Q.F16


def export_gguf(model, tokenizer, out: Path, out_type: str = "f16", name: str = "piconeox") -> dict:
    """Write `model` (a GPTNeoXForCausalLM) and its tokenizers.Tokenizer as GGUF to `out`, atomically.
    Returns {ggml type name: tensor count}."""
    import gguf
    import torch

    if out_type not in OUT_TYPES:
        raise PiconeoxError(f"--type {out_type!r} is not one of {', '.join(OUT_TYPES)}")
    cfg = model.config
    check_expressible(cfg)
    rope = cfg.rope_parameters or {}
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    writer = gguf.GGUFWriter(tmp, "gptneox")
    try:
        writer.add_name(name)
        writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                              "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[out_type])
        writer.add_context_length(cfg.max_position_embeddings)
        writer.add_embedding_length(cfg.hidden_size)
        writer.add_block_count(cfg.num_hidden_layers)
        writer.add_feed_forward_length(cfg.intermediate_size)
        writer.add_head_count(cfg.num_attention_heads)
        writer.add_rope_dimension_count(int(cfg.hidden_size // cfg.num_attention_heads
                                            * rope.get("partial_rotary_factor", 1.0)))
        writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
        writer.add_parallel_residual(bool(cfg.use_parallel_residual))
        writer.add_layer_norm_eps(cfg.layer_norm_eps)
        add_vocab(writer, tokenizer, cfg.vocab_size)
        counts: dict[str, int] = {}
        with torch.no_grad():
            for tname, t in gguf_tensors(model):
                data, qtype = encode(t.detach().float().cpu().numpy(), out_type)
                writer.add_tensor(tname, data, raw_dtype=qtype)
                counts[qtype.name] = counts.get(qtype.name, 0) + 1
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file(progress=True)
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return counts
