"""The GPT-NeoX forward pass for one token at a time, with a KV cache, over preallocated buffers.

Matches transformers' GPTNeoXForCausalLM: LayerNorm, fused QKV (rows stored q|k|v by the exporter),
partial rotary (rotate_half), causal softmax attention scaled by 1/sqrt(head_dim), parallel or
sequential residual, exact GELU MLP, final LayerNorm, tied or untied head.
"""
import gc
import math
from array import array

from . import kernels as K
from .modelfile import read_header, read_into, verify_checksum


def plan_buffers(h, lay, stream):
    """Every buffer the model needs: [(name, typecode, items)], largest first.

    Shared with the exporter, whose RAM estimate is the sum of these plus a fixed overhead.
    """
    d, n, v = h.hidden, h.inter, h.vocab
    resident_w = lay.n_weights
    plan = []
    if stream:  # embedding (+ untied head) stay; layers come from flash into one buffer
        resident_w = lay.w_layers0 + (0 if h.tied else v * d)
        plan.append(("layer", h.typecode, lay.w_layer))
    plan += [
        ("weights", h.typecode, resident_w),
        ("params", "f", lay.n_params),
        ("k_cache", "f", h.layers * h.context * d),
        ("v_cache", "f", h.layers * h.context * d),
        ("logits", "f", v),
        ("scores", "f", h.context),
        ("x", "f", d), ("h1", "f", d), ("h2", "f", d), ("attn", "f", d), ("out", "f", d),
        ("qkv", "f", 3 * d), ("mlp", "f", n),
        ("rope_cos", "f", h.context * (h.rotary_dims // 2)),
        ("rope_sin", "f", h.context * (h.rotary_dims // 2)),
    ]
    if h.int8:
        plan += [("xq", "i", max(d, n)), ("acc", "i", max(3 * d, n, v))]
    plan.sort(key=lambda e: -e[2] * (1 if e[1] == "b" else 4))
    return plan


def buffer_bytes(plan):
    """Bytes of the arrays in a plan (payload only)."""
    return sum(items * (1 if tc == "b" else 4) for _, tc, items in plan)


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
        gc.collect()  # then the largest buffers first, while the heap is least fragmented
        for name, typecode, items in plan_buffers(h, lay, stream):
            setattr(self, name, array(typecode, Zeros(items)))
        read_into(self.f, lay.p_offset, self.params, 4 * lay.n_params)
        w = self.weights
        if stream:
            embed = lay.w_layers0  # vocab x hidden elements, like an untied head
            read_into(self.f, lay.w_offset, memoryview(w)[:embed], embed * h.itemsize)
            if not h.tied:
                read_into(self.f, lay.w_offset + lay.w_head * h.itemsize, memoryview(w)[embed:], embed * h.itemsize)
            self.head_off = 0 if h.tied else embed
        else:
            read_into(self.f, lay.w_offset, w, lay.n_weights * h.itemsize)
            self.head_off = 0 if h.tied else lay.w_head
            self.f.close()
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

    def _layer_weights(self, layer):
        """(buffer, offset) of a layer's matrices, reading them from flash when streaming."""
        lay = self.lay
        if not self.stream:
            return self.weights, lay.w_layers0 + layer * lay.w_layer
        off = lay.w_offset + (lay.w_layers0 + layer * lay.w_layer) * self.h.itemsize
        read_into(self.f, off, self.layer, lay.w_layer * self.h.itemsize)
        return self.layer, 0

    def _linear(self, out, x, n_out, n_in, w, w_off, s_off, b_off):
        if self.h.int8:
            factor = K.quantize(self.xq, x, n_in)
            K.matvec_i8(out, w, w_off, self.xq, factor, n_out, n_in, self.params, s_off, b_off, self.acc)
        else:
            K.matvec_f32(out, w, w_off, x, n_out, n_in, self.params, b_off)

    def _embed(self, token):
        d, x, w = self.h.hidden, self.x, self.weights
        k = token * d
        s = self.params[self.lay.s_embed + token] if self.h.int8 else 1.0
        for i in range(d):
            x[i] = w[k + i] * s

    def forward(self, token, pos):
        """Run one token at position `pos` (0-based, < context); returns the `logits` array."""
        h, lay, p = self.h, self.lay, self.params
        if not 0 <= pos < h.context:
            raise ValueError("position %d outside the model's context of %d" % (pos, h.context))
        if not 0 <= token < h.vocab:
            raise ValueError("token %d outside the vocabulary of %d" % (token, h.vocab))
        d, n, hd, half = h.hidden, h.inter, h.head_dim, h.rotary_dims // 2
        x, h1, h2, qkv, att, out, mlp = self.x, self.h1, self.h2, self.qkv, self.attn, self.out, self.mlp
        rope = pos * half  # this position's row of the cos/sin tables
        self._embed(token)
        for layer in range(h.layers):
            w, w0 = self._layer_weights(layer)
            pb = layer * lay.p_layer
            sb = lay.s_layers0 + layer * lay.s_layer
            K.layernorm(h1, x, d, p, pb + lay.ln1_w, pb + lay.ln1_b, h.norm_eps)
            self._linear(qkv, h1, 3 * d, d, w, w0 + lay.qkv, sb, pb + lay.qkv_b)
            for head in range(h.heads):
                K.rotate(qkv, head * hd, self.rope_cos, self.rope_sin, rope, half)
                K.rotate(qkv, d + head * hd, self.rope_cos, self.rope_sin, rope, half)
            base = layer * h.context * d
            kv = base + pos * d
            for i in range(d):
                self.k_cache[kv + i] = qkv[d + i]
                self.v_cache[kv + i] = qkv[2 * d + i]
            K.attend(att, qkv, self.k_cache, self.v_cache, base, pos, h.heads, hd, d, self.scores, self.scale)
            self._linear(out, att, d, d, w, w0 + lay.dense, sb + 3 * d, pb + lay.dense_b)
            if not h.parallel_residual:
                for i in range(d):
                    x[i] += out[i]
            K.layernorm(h2, x, d, p, pb + lay.ln2_w, pb + lay.ln2_b, h.norm_eps)
            self._linear(mlp, h2, n, d, w, w0 + lay.fc_in, sb + 4 * d, pb + lay.fc_in_b)
            K.gelu(mlp, n)
            self._linear(h2, mlp, d, n, w, w0 + lay.fc_out, sb + 4 * d + n, pb + lay.fc_out_b)
            if h.parallel_residual:
                for i in range(d):
                    x[i] += out[i] + h2[i]
            else:
                for i in range(d):
                    x[i] += h2[i]
        K.layernorm(h1, x, d, p, lay.final_ln_w, lay.final_ln_b, h.norm_eps)
        self._linear(self.logits, h1, h.vocab, d, self.weights, self.head_off, lay.s_head, -1)
        return self.logits

    def close(self):
        """Release the file handle kept open for streaming."""
        self.f.close()
