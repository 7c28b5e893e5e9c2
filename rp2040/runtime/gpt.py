"""The GPT-NeoX forward pass for one token at a time, with a KV cache, over preallocated buffers.

Matches transformers' GPTNeoXForCausalLM: LayerNorm, fused QKV (rows stored q|k|v by the exporter),
partial rotary (rotate_half), causal softmax attention, parallel or sequential residual, GELU MLP,
final LayerNorm, tied or untied head. f32 models compute in floats (FloatGPT); int8 models compute
only in integers (IntGPT: rp2040/FORMAT.md's fixed point, spec rp2040/reference.py), with an int16
KV cache. Streaming keeps no weights in RAM (see plan_buffers).
"""
import gc
import math
from array import array

from . import fixed as fx
from . import intkernels as IK
from . import kernels as K
from .modelfile import FormatError, read_header, read_into, verify_checksum

ITEMSIZE = {"b": 1, "h": 2, "i": 4, "f": 4}


def head_chunk(h):
    """Rows of the output head read from flash per step when streaming: the largest matrix a layer
    has, so the `layer` buffer holds one chunk and no buffer grows with the vocabulary but logits."""
    return max(3 * h.hidden, h.inter)


def plan_buffers(h, lay, stream, xip=False):
    """Every buffer the model needs: [(name, typecode, items)], largest first.

    Shared with the exporter, whose RAM estimate is the sum of these plus the runtime's measured
    overhead. Streaming keeps no weights: each layer's W and P blocks, the embedding row of the token
    and the head's chunks are read from flash into `layer` and `layer_params`; `params` keeps P from
    the final norm on (int8: the row multipliers of the embedding and head, and the constant tables).
    """
    d, n, v, pt = h.hidden, h.inter, h.vocab, h.p_typecode
    if xip:  # the weights stay in memory-mapped flash: only P in RAM
        plan = [("params", pt, lay.n_params)]
    elif stream:
        plan = [("layer", h.typecode, lay.w_layer), ("layer_params", pt, lay.p_layer),
                ("params", pt, lay.n_params - lay.final_ln_w)]
    else:
        plan = [("weights", h.typecode, lay.n_weights), ("params", pt, lay.n_params)]
    kv = h.layers * h.context
    act = "i" if h.int8 else "f"
    plan += [("logits", act, v), ("scores", act, h.context), ("x", act, d), ("h1", act, d), ("h2", act, d),
             ("attn", act, d), ("out", act, d), ("qkv", act, 3 * d), ("mlp", act, n)]
    if h.int8:
        plan += [("k_cache", "h", kv * d), ("v_cache", "h", kv * d), ("k_shift", "b", kv), ("v_shift", "b", kv),
                 ("q", "i", d), ("xq", "i", max(d, n))]
    else:
        plan += [("k_cache", "f", kv * d), ("v_cache", "f", kv * d),
                 ("rope_cos", "f", h.context * (h.rotary_dims // 2)),
                 ("rope_sin", "f", h.context * (h.rotary_dims // 2))]
    plan.sort(key=lambda e: -e[2] * ITEMSIZE[e[1]])
    return plan


def buffer_bytes(plan):
    """Bytes of the arrays in a plan (payload only)."""
    return sum(items * ITEMSIZE[tc] for _, tc, items in plan)


class Zeros:
    """n zeros with a length: array(t, Zeros(n)) allocates its n items once, with no temporary copy."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        for _ in range(self.n):
            yield 0


def GPT(path, stream=False, verify=True, xip=None):
    """Load a model.bin for token-by-token inference: IntGPT for int8 files, FloatGPT for f32. With `xip`
    (config.json's runtime["xip"]) the file is the raw flash region, its weights read in place (xip.py)."""
    if xip:
        from .xip import open_region

        f = open_region(xip)
    else:
        f = open(path, "rb")
    try:
        h, lay = read_header(f)
        if xip and not all(h.interleaved(r, c) for r, c in ((h.vocab, h.hidden), (3 * h.hidden, h.hidden),
                                                             (h.hidden, h.inter), (h.inter, h.hidden))):
            raise FormatError("only a model.bin whose matrices are all interleaved is read in place")
        verified = verify_checksum(f, lay) if verify else False
    except Exception:
        f.close()
        raise
    return (IntGPT if h.int8 else FloatGPT)(f, h, lay, stream and not xip, verified, bool(xip))


class Model:
    """Buffers and weight access shared by both forward passes. `forward(token, pos)` returns logits."""

    def __init__(self, f, h, lay, stream, verified, xip=False):
        self.f, self.h, self.lay, self.stream, self.checksum_verified = f, h, lay, stream, verified
        self.xip = xip
        gc.collect()  # then the largest buffers first, while the heap is least fragmented
        for name, typecode, items in plan_buffers(h, lay, stream, xip):
            setattr(self, name, array(typecode, Zeros(items)))
        if xip:  # P into RAM, the weights addressed where they are (bytes q + 128 of interleaved matrices)
            self.p_base = 0
            read_into(f, lay.p_offset, self.params, 4 * lay.n_params)
            self.weights = f.mv[lay.w_offset:lay.w_offset + lay.n_weights] if hasattr(f, "mv") else None
        elif stream:
            self.p_base = lay.final_ln_w  # `params` holds P from the final norm on
            read_into(f, lay.p_offset + 4 * self.p_base, self.params, 4 * (lay.n_params - self.p_base))
        else:
            self.p_base = 0
            read_into(f, lay.p_offset, self.params, 4 * lay.n_params)
            read_into(f, lay.w_offset, self.weights, lay.n_weights * h.itemsize)
            f.close()
        self.chunk = (head_chunk(h) >> 2) << 2 if stream else h.vocab  # whole 4-row blocks of an interleaved head

    def _fetch(self, w_el, w_len, p_el, p_len):
        """(w, w_off, p, p_off) addressing W elements w_el.. and P elements p_el..; streaming reads
        w_len and p_len of them from flash into the layer buffers first."""
        if not self.stream:
            return self.weights, w_el, self.params, p_el
        h, lay = self.h, self.lay
        read_into(self.f, lay.w_offset + w_el * h.itemsize, memoryview(self.layer)[:w_len], w_len * h.itemsize)
        if p_len:
            read_into(self.f, lay.p_offset + 4 * p_el, memoryview(self.layer_params)[:p_len], 4 * p_len)
        return self.layer, 0, self.layer_params, 0

    def _check(self, token, pos):
        if not 0 <= pos < self.h.context:
            raise ValueError("position %d outside the model's context of %d" % (pos, self.h.context))
        if not 0 <= token < self.h.vocab:
            raise ValueError("token %d outside the vocabulary of %d" % (token, self.h.vocab))

    def _add_mlp(self, d):
        """x += attention (parallel residual) + MLP output (in h2); sequential added attention already."""
        x, out, h2 = self.x, self.out, self.h2
        if self.h.parallel_residual:
            for i in range(d):
                x[i] += out[i] + h2[i]
        else:
            for i in range(d):
                x[i] += h2[i]

    def close(self):
        """Release the file handle kept open for streaming."""
        self.f.close()


class IntGPT(Model):
    """int8 weights, int32 fixed-point activations, int16 KV cache: no float is made per token."""

    def __init__(self, f, h, lay, stream, verified, xip=False):
        super().__init__(f, h, lay, stream, verified, xip)
        c = lay.consts - self.p_base  # the constants block inside `params`
        p = self.params
        self.c_off = c
        self.eps = p[c + fx.C_EPS]
        self.exp = array("i", fx.EXP_TABLE)
        self.gelu_off = c + lay.gelu
        self.cos_off, self.sin_off = c + lay.cos, c + lay.sin
        self.norm_bits = fx.norm_bits(h.hidden)
        self.qk_limit = (1 << fx.qk_bits(h.head_dim)) - 1
        self.v_limit = (1 << fx.V_BITS) - 1
        self.limit_d, self.limit_n = fx.input_limit(h.hidden), fx.input_limit(h.inter)
        d, n = h.hidden, h.inter  # each matrix shape's kernel: matvec4 for 4-row interleaved blocks (v4)
        self.kernel = {r * 65536 + c: IK.matvec4 if h.interleaved(r, c) else IK.matvec
                       for r, c in ((3 * d, d), (d, d), (n, d), (d, n))}

    def _linear(self, out, x, n_out, n_in, limit, w, w_off, p, m_off, shift, b_off):
        s = IK.quantize(self.xq, 0, x, 0, n_in, limit)
        self.kernel[n_out * 65536 + n_in](out, w, w_off, self.xq, n_out, n_in, p, m_off, shift - s, b_off)

    def _embed(self, token, d):
        """x = the token's embedding row, in Q16 (a row of an interleaved table is every 4th byte of its block)."""
        lay = self.lay
        mult = self.params[lay.s_embed - self.p_base + token]
        s = self.params[self.c_off + fx.C_EMBED_S] - fx.ACT_FRAC
        if self.h.interleaved(self.h.vocab, d):
            w, k, _, _ = self._fetch((token >> 2) * 4 * d, 4 * d, 0, 0)
            IK.embed(self.x, w, k + (token & 3), 4, 0, d, mult, s)
        else:
            w, k, _, _ = self._fetch(token * d, d, 0, 0)
            IK.embed(self.x, w, k, 1, 128, d, mult, s)

    def _add_mlp(self, d):
        IK.residual(self.x, self.out, self.h2, d, self.h.parallel_residual)

    def forward(self, token, pos):
        """Run one token at position `pos` (0-based, < context); returns the int32 logits (Q16)."""
        self._check(token, pos)
        h, lay, prm = self.h, self.lay, self.params
        d, n, hd, half = h.hidden, h.inter, h.head_dim, h.rotary_dims // 2
        x, h1, h2, qkv, att, out, mlp = self.x, self.h1, self.h2, self.qkv, self.attn, self.out, self.mlp
        ld, ln = self.limit_d, self.limit_n
        self._embed(token, d)
        cos, sin = self.cos_off + pos * half, self.sin_off + pos * half
        for layer in range(h.layers):
            w, w0, p, pb = self._fetch(lay.w_layers0 + layer * lay.w_layer, lay.w_layer,
                                       layer * lay.p_layer, lay.p_layer)
            sh = pb + lay.shifts
            IK.layernorm(h1, x, d, p, pb + lay.ln1_w, pb + lay.ln1_b, p[sh], self.eps, self.norm_bits)
            self._linear(qkv, h1, 3 * d, d, ld, w, w0 + lay.qkv, p, pb + lay.qkv_s, p[sh + 2], pb + lay.qkv_b)
            base = layer * h.context * d  # this layer's cache rows, one per position
            kv = base + pos * d
            srow = layer * h.context  # and their shifts
            sq = IK.quantize(self.q, 0, qkv, 0, d, self.qk_limit)
            IK.rotate(self.q, 0, h.heads, hd, half, prm, cos, sin)
            self.k_shift[srow + pos] = IK.quantize(self.xq, 0, qkv, d, d, self.qk_limit)
            IK.rotate(self.xq, 0, h.heads, hd, half, prm, cos, sin)
            IK.store16(self.k_cache, kv, self.xq, d)
            self.v_shift[srow + pos] = IK.quantize(self.xq, 0, qkv, 2 * d, d, self.v_limit)
            IK.store16(self.v_cache, kv, self.xq, d)
            IK.attend(att, self.q, sq, self.k_cache, self.v_cache, base, pos, h.heads, hd, d,
                      self.k_shift, self.v_shift, srow, self.scores, self.exp, 0)
            self._linear(out, att, d, d, ld, w, w0 + lay.dense, p, pb + lay.dense_s, p[sh + 3], pb + lay.dense_b)
            if not h.parallel_residual:
                IK.residual(x, out, out, d, False)
            IK.layernorm(h2, x, d, p, pb + lay.ln2_w, pb + lay.ln2_b, p[sh + 1], self.eps, self.norm_bits)
            self._linear(mlp, h2, n, d, ld, w, w0 + lay.fc_in, p, pb + lay.fc_in_s, p[sh + 4], pb + lay.fc_in_b)
            IK.gelu(mlp, n, prm, self.gelu_off)
            self._linear(h2, mlp, d, n, ln, w, w0 + lay.fc_out, p, pb + lay.fc_out_s, p[sh + 5], pb + lay.fc_out_b)
            self._add_mlp(d)
        pf = lay.final_ln_w - self.p_base
        IK.layernorm(h1, x, d, prm, pf, pf + d, prm[self.c_off + fx.C_FINAL_S], self.eps, self.norm_bits)
        s = IK.quantize(self.xq, 0, h1, 0, d, ld)
        self._head(prm[self.c_off + fx.C_HEAD_S] - s)
        return self.logits

    def _head(self, shift):
        """logits = the head's rows times xq (the final norm's output, quantized), with `shift`."""
        h, lay, d = self.h, self.lay, self.h.hidden
        logits = memoryview(self.logits)
        mv = IK.matvec4 if h.interleaved(h.vocab, d) else IK.matvec
        for r0 in range(0, h.vocab, self.chunk):  # one chunk unless streaming
            rows = min(self.chunk, h.vocab - r0)
            w, w0, _, _ = self._fetch(lay.w_head + r0 * d, rows * d, 0, 0)
            mv(logits[r0:r0 + rows], w, w0, self.xq, rows, d, self.params, lay.s_head - self.p_base + r0, shift, -1)


class FloatGPT(Model):
    """f32 weights and activations (floats: each result is a heap object on the RP2040)."""

    def __init__(self, f, h, lay, stream, verified, xip=False):
        super().__init__(f, h, lay, stream, verified, xip)
        # As transformers: inv_freq[i] = base ** (-2i / rotary_dims); angle = pos * inv_freq[i].
        half = h.rotary_dims // 2
        for i in range(half):
            inv_freq = 1.0 / (h.rotary_base ** (2 * i / h.rotary_dims))
            for pos in range(h.context):
                self.rope_cos[pos * half + i] = math.cos(pos * inv_freq)
                self.rope_sin[pos * half + i] = math.sin(pos * inv_freq)
        self.scale = 1.0 / math.sqrt(h.head_dim)

    def forward(self, token, pos):
        """Run one token at position `pos` (0-based, < context); returns the float logits."""
        self._check(token, pos)
        h, lay = self.h, self.lay
        d, n, hd, half = h.hidden, h.inter, h.head_dim, h.rotary_dims // 2
        x, h1, h2, qkv, att, out, mlp = self.x, self.h1, self.h2, self.qkv, self.attn, self.out, self.mlp
        rope = pos * half  # this position's row of the cos/sin tables
        w, k, _, _ = self._fetch(token * d, d, 0, 0)
        for i in range(d):
            x[i] = w[k + i]
        for layer in range(h.layers):
            w, w0, p, pb = self._fetch(lay.w_layers0 + layer * lay.w_layer, lay.w_layer,
                                       layer * lay.p_layer, lay.p_layer)
            K.layernorm(h1, x, d, p, pb + lay.ln1_w, pb + lay.ln1_b, h.norm_eps)
            K.matvec_f32(qkv, w, w0 + lay.qkv, h1, 3 * d, d, p, pb + lay.qkv_b)
            for head in range(h.heads):
                K.rotate(qkv, head * hd, self.rope_cos, self.rope_sin, rope, half)
                K.rotate(qkv, d + head * hd, self.rope_cos, self.rope_sin, rope, half)
            base = layer * h.context * d  # this layer's cache rows, one per position
            kv = base + pos * d
            for i in range(d):
                self.k_cache[kv + i] = qkv[d + i]
                self.v_cache[kv + i] = qkv[2 * d + i]
            K.attend(att, qkv, self.k_cache, self.v_cache, base, pos, h.heads, hd, d, self.scores, self.scale)
            K.matvec_f32(out, w, w0 + lay.dense, att, d, d, p, pb + lay.dense_b)
            if not h.parallel_residual:
                for i in range(d):
                    x[i] += out[i]
            K.layernorm(h2, x, d, p, pb + lay.ln2_w, pb + lay.ln2_b, h.norm_eps)
            K.matvec_f32(mlp, w, w0 + lay.fc_in, h2, n, d, p, pb + lay.fc_in_b)
            K.gelu(mlp, n)
            K.matvec_f32(h2, w, w0 + lay.fc_out, mlp, d, n, p, pb + lay.fc_out_b)
            self._add_mlp(d)
        pf = lay.final_ln_w - self.p_base
        K.layernorm(h1, x, d, self.params, pf, pf + d, h.norm_eps)
        logits = memoryview(self.logits)
        for r0 in range(0, h.vocab, self.chunk):  # one chunk unless streaming
            rows = min(self.chunk, h.vocab - r0)
            w, w0, _, _ = self._fetch(lay.w_head + r0 * d, rows * d, 0, 0)
            K.matvec_f32(logits[r0:r0 + rows], w, w0, h1, rows, d, None, -1)
        return self.logits
