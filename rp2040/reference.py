"""The host reference of the int8 integer forward pass and sampler: the spec the device must equal.

    python -m rp2040.reference models/<name> --text ../shared/data/tinystories/tinystories_val.txt
        [--checkpoint CKPT] [--max-tokens 20000]

numpy, vectorised over a sequence's positions; every step is rp2040/FORMAT.md's integer arithmetic,
so the runtime (viper on the board, plain Python on the host and in WebAssembly) must produce the same
integers, hence the same token ids. Every intermediate is checked to fit a 32-bit signed word.
The CLI reports the reference's val loss on held-out text next to PyTorch float32's on the checkpoint.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from rp2040.model_bin import deinterleave
from rp2040.reference_ops import exp_q15, fits, gelu, layernorm, linear, quantize, rotate, shr
from rp2040.runtime import fixed as fx
from rp2040.runtime.modelfile import HEADER_SIZE, FormatError, Header, Layout
from utils.errors import PiconeoxError
from utils.textfile import read_json, read_text


class ReferenceModel:
    """An int8 model.bin as numpy arrays; `logits(ids)` gives every position's int logits (Q16)."""

    def __init__(self, path: str | Path):
        data = Path(path).read_bytes()
        h = Header(data[:HEADER_SIZE])
        if not h.int8:
            raise PiconeoxError(f"{path} is an f32 export; the integer reference needs --dtype int8")
        lay = Layout(h)
        self.h, self.lay = h, lay
        p = np.frombuffer(data, "<i4", lay.n_params, lay.p_offset).astype(np.int64)
        w = np.frombuffer(data, "i1", lay.n_weights, lay.w_offset)
        d, n = h.hidden, h.inter
        self.consts = p[lay.consts:]
        c = self.consts
        half = h.rotary_dims // 2
        self.gelu_t = c[lay.gelu:lay.gelu + fx.GELU_N]
        self.exp_t = np.array(fx.EXP_TABLE, np.int64)
        self.cos = c[lay.cos:lay.cos + h.context * half].reshape(h.context, half)
        self.sin = c[lay.sin:lay.sin + h.context * half].reshape(h.context, half)
        self.eps = int(c[fx.C_EPS])
        def mat(at, n_out, n_in):  # row-major int8, whatever the file's layout
            raw = w[at:at + n_out * n_in]
            return deinterleave(raw, n_out, n_in) if h.interleaved(n_out, n_in) else raw.reshape(n_out, n_in)

        self.embed = mat(0, h.vocab, d)
        self.embed_m, self.embed_s = p[lay.s_embed:lay.s_embed + h.vocab], int(c[fx.C_EMBED_S])
        if h.tied:
            self.head, self.head_m = self.embed, self.embed_m
        else:
            self.head = mat(lay.w_head, h.vocab, d)
            self.head_m = p[lay.s_head:lay.s_head + h.vocab]
        self.head_s = int(c[fx.C_HEAD_S])
        self.final = (p[lay.final_ln_w:lay.final_ln_w + d], p[lay.final_ln_b:lay.final_ln_b + d], int(c[fx.C_FINAL_S]))
        self.layers = []
        for i in range(h.layers):
            b = p[i * lay.p_layer:(i + 1) * lay.p_layer]
            wl = lay.w_layers0 + i * lay.w_layer
            sh = [int(v) for v in b[lay.shifts:lay.shifts + 6]]
            mats = [mat(wl + lay.qkv, 3 * d, d), mat(wl + lay.dense, d, d), mat(wl + lay.fc_in, n, d),
                    mat(wl + lay.fc_out, d, n)]
            self.layers.append({
                "ln1": (b[lay.ln1_w:lay.ln1_b], b[lay.ln1_b:lay.ln2_w], sh[0]),
                "ln2": (b[lay.ln2_w:lay.ln2_b], b[lay.ln2_b:lay.qkv_b], sh[1]),
                "qkv": (mats[0], b[lay.qkv_s:lay.dense_s], sh[2], b[lay.qkv_b:lay.dense_b]),
                "dense": (mats[1], b[lay.dense_s:lay.fc_in_s], sh[3], b[lay.dense_b:lay.fc_in_b]),
                "fc_in": (mats[2], b[lay.fc_in_s:lay.fc_out_s], sh[4], b[lay.fc_in_b:lay.fc_out_b]),
                "fc_out": (mats[3], b[lay.fc_out_s:lay.fc_out_s + d], sh[5], b[lay.fc_out_b:lay.fc_out_b + d]),
            })

    def _attention(self, qkv: np.ndarray) -> np.ndarray:
        h = self.h
        d, hd, t = h.hidden, h.head_dim, qkv.shape[0]
        lim = (1 << fx.qk_bits(hd)) - 1
        q, sq = quantize(qkv[:, :d], lim)
        k, sk = quantize(qkv[:, d:2 * d], lim)
        v, sv = quantize(qkv[:, 2 * d:], (1 << fx.V_BITS) - 1)
        q = rotate(q, self.cos[:t], self.sin[:t], h.heads, hd)
        k = rotate(k, self.cos[:t], self.sin[:t], h.heads, hd)
        out = np.zeros((t, d), np.int64)
        causal = np.tril(np.ones((t, t), bool))
        for head in range(h.heads):
            cols = slice(head * hd, (head + 1) * hd)
            raw = fits(q[:, cols] @ k[:, cols].T, "an attention score")
            z = fits(shr(raw, 22 - sq[:, None] - sk[None, :]), "an attention score")
            z = np.where(causal, z, np.iinfo(np.int64).min // 4)
            p = np.where(causal, exp_q15(np.where(causal, z.max(1, keepdims=True) - z, 0), self.exp_t), 0)
            wgt = (p << fx.EXP_FRAC) // p.sum(1, keepdims=True)
            terms = shr(wgt[:, :, None] * v[None, :, cols], 11 - sv[None, :, None])  # Q20
            out[:, cols] = fits(terms.sum(1), "an attention output") >> 4
        return out

    def logits(self, ids: list[int]) -> np.ndarray:
        """Int logits (value = int / 2**16) of every position of `ids` (at most the context)."""
        h = self.h
        if len(ids) > h.context:
            raise ValueError(f"{len(ids)} tokens exceed the context of {h.context}")
        ids = np.asarray(ids)
        x = shr(self.embed[ids].astype(np.int64) * self.embed_m[ids, None], self.embed_s - fx.ACT_FRAC)
        for L in self.layers:
            h1 = layernorm(x, *L["ln1"], self.eps)
            att = linear(self._attention(linear(h1, *L["qkv"])), *L["dense"])
            if not h.parallel_residual:
                x = fits(x + att, "the residual stream")
            h2 = layernorm(x, *L["ln2"], self.eps)
            mlp = linear(gelu(linear(h2, *L["fc_in"]), self.gelu_t), *L["fc_out"])
            x = fits(x + mlp + (att if h.parallel_residual else 0), "the residual stream")
        return linear(layernorm(x, *self.final, self.eps), self.head, self.head_m, self.head_s, None)


class ReferenceSampler:
    """The integer sampler (FORMAT.md): greedy, or top-k over exp-table probabilities with xorshift32."""

    def __init__(self, temperature: float, top_k: int, seed: int):
        self.inv_t = int((1 << fx.INV_T_FRAC) / temperature + 0.5) if temperature > 0 else 0
        self.greedy = temperature <= 0 or top_k == 1 or self.inv_t > fx.MULT_MAX
        self.top_k = top_k
        self.state = (seed & 0xFFFFFFFF) or 0x9E3779B9

    def rand30(self) -> int:
        x = self.state
        x ^= (x << 13) & 0xFFFFFFFF
        x ^= x >> 17
        x ^= (x << 5) & 0xFFFFFFFF
        self.state = x
        return x >> 2

    def __call__(self, logits: np.ndarray, exp_t: np.ndarray) -> int:
        z = logits.astype(np.int64)
        if self.greedy:
            return int(np.argmax(z))
        top = z.max()
        keep = np.ones(len(z), bool)
        if 0 < self.top_k < len(z):
            keep = z >= np.partition(z, len(z) - self.top_k)[len(z) - self.top_k]
        d6 = (top - z) >> 6
        far = d6 >= 1 << 16
        u = (np.where(far, 0, d6) * self.inv_t) >> fx.INV_T_FRAC
        p = np.where(keep & ~far, exp_q15(u, exp_t), 0)
        r = self.rand30() % int(p.sum())
        return int(np.argmax(np.cumsum(p) > r))


def generate(model: ReferenceModel, prompt: list[int], n: int, temperature: float, top_k: int, seed: int,
             eos: int = -1) -> list[int]:
    """What the device generates: ids after `prompt`, stopping after `n` or at end-of-text (included)."""
    sampler, ids, out = ReferenceSampler(temperature, top_k, seed), list(prompt), []
    while len(out) < n and len(ids) < model.h.context:
        t = sampler(model.logits(ids)[-1], model.exp_t)
        out.append(t)
        if t == eos:
            break
        ids.append(t)
    return out


def val_losses(model_dir: Path, text: str, checkpoint: Path | None = None, max_tokens: int = 20000) -> dict:
    """Mean next-token loss on `text` (windows of the model's context) of the integer reference and of
    PyTorch float32 on the checkpoint it was exported from."""
    import torch
    from tokenizers import Tokenizer

    from rp2040.bundle import check_model
    from utils.ckpt.read import load_model, tokenizer_problem

    config = read_json(Path(model_dir) / "config.json", "the model's")
    checkpoint = Path(checkpoint or config["source"])
    if not all((checkpoint / name).is_file() for name in ("tokenizer.json", "config.json")):
        raise PiconeoxError(f"{checkpoint} has no tokenizer.json or config.json; pass --checkpoint, the folder the "
                            "model came from")
    check_model(Path(model_dir) / "model.bin")  # a header that lies is one line, not a division by zero
    ref = ReferenceModel(Path(model_dir) / "model.bin")
    c, h = read_json(checkpoint / "config.json", "--checkpoint"), ref.h
    theirs = tuple(c.get(k) for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"))
    if theirs != (h.vocab, h.hidden, h.layers, h.heads):
        raise PiconeoxError(f"--checkpoint {checkpoint} is another model (vocab, hidden, layers, heads {theirs}) than "
                            f"{model_dir} ({(h.vocab, h.hidden, h.layers, h.heads)}): pass the checkpoint it was "
                            "exported from")
    if why := tokenizer_problem(checkpoint / "tokenizer.json", h.vocab):  # its pipeline and count, before it is built
        raise PiconeoxError(f"--checkpoint {why}")
    ids = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    ids = ids[:max_tokens + 1]
    ctx = ref.h.context
    windows = [ids[i:i + ctx] for i in range(0, len(ids) - 1, ctx - 1) if len(ids[i:i + ctx]) > 1]
    if not windows:
        raise PiconeoxError("the text is too short: it needs at least 2 tokens")
    torch_model = load_model(checkpoint)  # float32, eval; checked against its marker when it has one
    totals = {"int8 reference": 0.0, "PyTorch f32": 0.0}
    count = 0
    for w in windows:
        target = np.asarray(w[1:])
        z = ref.logits(w)[:-1].astype(np.float64) / 2 ** fx.ACT_FRAC
        with torch.no_grad():
            f = torch_model(torch.tensor([w])).logits[0, :-1].double().numpy()
        for name, logits in (("int8 reference", z), ("PyTorch f32", f)):
            top = logits.max(-1, keepdims=True)
            logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
            totals[name] -= logp[np.arange(len(target)), target].sum()
        count += len(target)
    return {name: total / count for name, total in totals.items()} | {"tokens": count}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rp2040.reference", description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="an int8 export, e.g. models/<name>")
    ap.add_argument("--text", type=Path, required=True, help="held-out text, e.g. a validation file")
    ap.add_argument("--checkpoint", type=Path,
                    help="the checkpoint it was exported from (default: config.json's source)")
    ap.add_argument("--max-tokens", type=int, default=20000, help="evaluate at most this many tokens (default 20000)")
    args = ap.parse_args(argv)
    try:
        if args.max_tokens < 1:
            raise PiconeoxError(f"--max-tokens {args.max_tokens} must be >= 1")
        if not args.text.is_file():
            raise PiconeoxError(f"--text {args.text} is not a file")
        text = read_text(args.text, "--text")  # a binary file is one line, not a loss on replacement characters
        losses = val_losses(args.model_dir, text, args.checkpoint, args.max_tokens)
    except (PiconeoxError, FormatError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ref, f32 = losses["int8 reference"], losses["PyTorch f32"]
    print(f"val loss on {losses['tokens']:,} tokens of {args.text.name}: int8 integer reference {ref:.4f} "
          f"(ppl {math.exp(ref):.2f}), PyTorch f32 {f32:.4f} (ppl {math.exp(f32):.2f}), {100 * (ref / f32 - 1):+.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
