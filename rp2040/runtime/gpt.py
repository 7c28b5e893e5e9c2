"""The GPT-NeoX forward pass for one token at a time, with a KV cache, over preallocated buffers.

Matches transformers' GPTNeoXForCausalLM: LayerNorm, fused QKV (rows stored q|k|v by the exporter),
partial rotary (rotate_half), causal softmax attention scaled by 1/sqrt(head_dim), parallel or
sequential residual, exact GELU MLP, final LayerNorm, tied or untied head. int8 models keep an
int16 KV cache; streaming keeps no weights in RAM (see plan_buffers).
"""
import gc
import math
from array import array

from . import kernels as K
from .modelfile import read_header, read_into, verify_checksum


# int8 models keep K and V as int16 rows with one float scale per row (layer, position): half the
# bytes of a float cache, and 1/32767 of the row's largest value, finer than the activations' fixed point.
KV_LEVELS = 32767
ITEMSIZE = {"b": 1, "h": 2, "i": 4, "f": 4}


def head_chunk(h):
    """Rows of the output head computed per step: the largest matrix a layer has, so `acc` and the
    streaming buffers of a layer hold one chunk and no buffer grows with the vocabulary but logits."""
    return max(3 * h.hidden, h.inter)


def plan_buffers(h, lay, stream):
    """Every buffer the model needs: [(name, typecode, items)], largest first.

    Shared with the exporter, whose RAM estimate is the sum of these plus a fixed overhead.
    Streaming keeps no weights: each layer's W and P blocks, the embedding row of the token and
    the head's chunks are read from flash into `layer` and `layer_params`; only the final norm stays.
    """
    d, n, v = h.hidden, h.inter, h.vocab
    if stream:
        plan = [("layer", h.typecode, lay.w_layer), ("layer_params", "f", lay.p_layer), ("params", "f", 2 * d)]
    else:
        plan = [("weights", h.typecode, lay.n_weights), ("params", "f", lay.n_params)]
    kv = h.layers * h.context
    plan += [
        ("k_cache", "h" if h.int8 else "f", kv * d),
        ("v_cache", "h" if h.int8 else "f", kv * d),
        ("logits", "f", v),
        ("scores", "f", h.context),
        ("x", "f", d), ("h1", "f", d), ("h2", "f", d), ("attn", "f", d), ("out", "f", d),
        ("qkv", "f", 3 * d), ("mlp", "f", n),
        ("rope_cos", "f", h.context * (h.rotary_dims // 2)),
        ("rope_sin", "f", h.context * (h.rotary_dims // 2)),
    ]
    if h.int8:
        plan += [("k_scale", "f", kv), ("v_scale", "f", kv), ("xq", "i", max(d, n)), ("acc", "i", head_chunk(h))]
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


class GPT:
    """A model.bin loaded for token-by-token inference. `forward(token, pos)` returns the logits array."""

    def __init__(self, path, stream=False, verify=True):
        self.f = open(path, "rb")
        h, lay = read_header(self.f)
        self.h, self.lay, self.stream = h, lay, stream
        self.checksum_verified = verify_checksum(self.f, lay) if verify else False
        self.k_scale = self.v_scale = None  # float KV cache unless the plan has int16 rows
        gc.collect()  # then the largest buffers first, while the heap is least fragmented
        for name, typecode, items in plan_buffers(h, lay, stream):
            setattr(self, name, array(typecode, Zeros(items)))
        if stream:
            self.p_base = lay.final_ln_w  # `params` holds P from the final norm on
            read_into(self.f, lay.p_offset + 4 * self.p_base, self.params, 8 * h.hidden)
        else:
            self.p_base = 0
            read_into(self.f, lay.p_offset, self.params, 4 * lay.n_params)
            read_into(self.f, lay.w_offset, self.weights, lay.n_weights * h.itemsize)
            self.f.close()
        self.chunk = head_chunk(h)
        self._init_rope()
        self.scale = 1.0 / math.sqrt(h.head_dim)

    def _init_rope(self):
        # As transformers: inv_freq[i] = base ** (-2i / rotary_dims); angle = pos * inv_freq[i].
        half = self.h.rotary_dims // 2
        for i in range(half):
            inv_freq = 1.0 / (self.h.rotary_base ** (2 * i / self.h.rotary_dims))
            for pos in range(self.h.context):
                self.rope_cos[pos * half + i] = math.cos(pos * inv_freq)
                self.rope_sin[pos * half + i] = math.sin(pos * inv_freq)

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

    def _linear(self, out, x, n_out, n_in, w, w_off, p, s_off, b_off):
        if self.h.int8:
            factor = K.quantize(self.xq, 0, x, 0, n_in, K.activation_levels(n_in))
            K.matvec_i8(out, w, w_off, self.xq, factor, n_out, n_in, p, s_off, b_off, self.acc)
        else:
            K.matvec_f32(out, w, w_off, x, n_out, n_in, p, b_off)

    def _embed(self, token):
        d, x = self.h.hidden, self.x
        w, k, p, s = self._fetch(token * d, d, self.lay.s_embed + token, 1 if self.h.int8 else 0)
        scale = p[s] if self.h.int8 else 1.0
        for i in range(d):
            x[i] = w[k + i] * scale

    def _head(self, x):
        """logits = head(x), `chunk` rows at a time (tied: the embedding's rows and scales)."""
        h, lay, d = self.h, self.lay, self.h.hidden
        logits = memoryview(self.logits)
        for r0 in range(0, h.vocab, self.chunk):
            rows = min(self.chunk, h.vocab - r0)
            w, w0, p, s0 = self._fetch(lay.w_head + r0 * d, rows * d, lay.s_head + r0, rows if h.int8 else 0)
            self._linear(logits[r0:r0 + rows], x, rows, d, w, w0, p, s0, -1)

    def forward(self, token, pos):
        """Run one token at position `pos` (0-based, < context); returns the `logits` array."""
        h, lay = self.h, self.lay
        if not 0 <= pos < h.context:
            raise ValueError("position %d outside the model's context of %d" % (pos, h.context))
        if not 0 <= token < h.vocab:
            raise ValueError("token %d outside the vocabulary of %d" % (token, h.vocab))
        d, n, hd, half = h.hidden, h.inter, h.head_dim, h.rotary_dims // 2
        x, h1, h2, qkv, att, out, mlp = self.x, self.h1, self.h2, self.qkv, self.attn, self.out, self.mlp
        rope = pos * half  # this position's row of the cos/sin tables
        self._embed(token)
        for layer in range(h.layers):
            w, w0, p, pb = self._fetch(lay.w_layers0 + layer * lay.w_layer, lay.w_layer,
                                       layer * lay.p_layer, lay.p_layer)
            K.layernorm(h1, x, d, p, pb + lay.ln1_w, pb + lay.ln1_b, h.norm_eps)
            self._linear(qkv, h1, 3 * d, d, w, w0 + lay.qkv, p, pb + lay.qkv_s, pb + lay.qkv_b)
            for head in range(h.heads):
                K.rotate(qkv, head * hd, self.rope_cos, self.rope_sin, rope, half)
                K.rotate(qkv, d + head * hd, self.rope_cos, self.rope_sin, rope, half)
            base = layer * h.context * d  # this layer's cache rows, one per position
            kv = base + pos * d
            srow = layer * h.context  # and their scales (int8 models)
            if h.int8:
                self.k_scale[srow + pos] = K.quantize(self.k_cache, kv, qkv, d, d, KV_LEVELS)
                self.v_scale[srow + pos] = K.quantize(self.v_cache, kv, qkv, 2 * d, d, KV_LEVELS)
            else:
                for i in range(d):
                    self.k_cache[kv + i] = qkv[d + i]
                    self.v_cache[kv + i] = qkv[2 * d + i]
            K.attend(att, qkv, self.k_cache, self.v_cache, base, pos, h.heads, hd, d, self.scores, self.scale,
                     self.k_scale, self.v_scale, srow)
            self._linear(out, att, d, d, w, w0 + lay.dense, p, pb + lay.dense_s, pb + lay.dense_b)
            if not h.parallel_residual:
                for i in range(d):
                    x[i] += out[i]
            K.layernorm(h2, x, d, p, pb + lay.ln2_w, pb + lay.ln2_b, h.norm_eps)
            self._linear(mlp, h2, n, d, w, w0 + lay.fc_in, p, pb + lay.fc_in_s, pb + lay.fc_in_b)
            K.gelu(mlp, n)
            self._linear(h2, mlp, d, n, w, w0 + lay.fc_out, p, pb + lay.fc_out_s, pb + lay.fc_out_b)
            if h.parallel_residual:
                for i in range(d):
                    x[i] += out[i] + h2[i]
            else:
                for i in range(d):
                    x[i] += h2[i]
        pf = lay.final_ln_w - self.p_base
        K.layernorm(h1, x, d, self.params, pf, pf + d, h.norm_eps)
        self._head(h1)
        return self.logits

    def close(self):
        """Release the file handle kept open for streaming."""
        self.f.close()
