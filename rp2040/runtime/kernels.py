"""Numeric kernels of the forward pass, in plain Python that MicroPython and CPython both run.

Buffers are preallocated `array`s; kernels write into `out` and never build lists. Weights are
addressed as (buffer, element offset) so one kernel serves resident and streamed layers. The int8
matrix kernel accumulates in integers: on an RP2040 every float result is a heap object, a small
int is not. `rows_dot_i8` is replaced by a viper version when the port supports it (kernels_native).
"""
import math

try:
    from math import erf
except ImportError:  # builds without math special functions: Abramowitz-Stegun 7.1.26 (error < 1.5e-7)
    def erf(x):
        s = 1.0 if x >= 0 else -1.0
        x = abs(x)
        t = 1.0 / (1.0 + 0.3275911 * x)
        y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * math.exp(-x * x)
        return s * y

INV_SQRT2 = 1.0 / math.sqrt(2.0)
# Fixed-point activations for the int8 kernel: |sum of n products| <= 127 * n * limit < 2**29, so the
# accumulator stays a small int (no heap) on a 32-bit MicroPython and fits viper's machine word.
ACC_BOUND = 1 << 29


def layernorm(out, x, n, p, w_off, b_off, eps):
    """out[:n] = LayerNorm(x[:n]) with weight p[w_off:] and bias p[b_off:] (biased variance, as torch)."""
    mean = 0.0
    for i in range(n):
        mean += x[i]
    mean /= n
    var = 0.0
    for i in range(n):
        t = x[i] - mean
        var += t * t
    inv = 1.0 / math.sqrt(var / n + eps)
    for i in range(n):
        out[i] = (x[i] - mean) * inv * p[w_off + i] + p[b_off + i]


def gelu(x, n):
    """In place: the exact (erf) GELU that transformers' hidden_act="gelu" uses."""
    for i in range(n):
        v = x[i]
        x[i] = 0.5 * v * (1.0 + erf(v * INV_SQRT2))


def matvec_f32(out, w, w_off, x, n_out, n_in, p, b_off):
    """out[o] = sum_i w[w_off + o*n_in + i] * x[i] (+ p[b_off + o] when b_off >= 0)."""
    k = w_off
    for o in range(n_out):
        s = 0.0
        for i in range(n_in):
            s += w[k + i] * x[i]
        out[o] = s + p[b_off + o] if b_off >= 0 else s
        k += n_in


def quantize(q, q_off, x, x_off, n, levels):
    """q[q_off:][:n] = round(x[x_off:][:n] / scale) with scale = max|x| / levels; returns scale (x ~ q * scale).

    Used for the int8 path's fixed-point activations and for its int16 KV cache rows.
    """
    m = 0.0
    for i in range(n):
        a = abs(x[x_off + i])
        if a > m:
            m = a
    if m == 0.0:
        for i in range(n):
            q[q_off + i] = 0
        return 0.0
    scale = m / levels
    for i in range(n):
        q[q_off + i] = round(x[x_off + i] / scale)
    return scale


def activation_levels(n):
    """Fixed-point levels for an n-input int8 dot product: the accumulator stays below ACC_BOUND."""
    return ACC_BOUND // (127 * n)


def rows_dot_i8(acc, w, w_off, xq, n_out, n_in):
    """acc[o] = sum_i w[w_off + o*n_in + i] * xq[i], all in integers."""
    k = w_off
    for o in range(n_out):
        s = 0
        for i in range(n_in):
            s += w[k + i] * xq[i]
        acc[o] = s
        k += n_in


try:
    from .kernels_native import rows_dot_i8  # noqa: F811  (viper: RP2040 and other native ports)
except (ImportError, SyntaxError):
    pass  # CPython, or a port without native emitters (WebAssembly): keep the plain loop


def matvec_i8(out, w, w_off, xq, x_factor, n_out, n_in, p, s_off, b_off, acc):
    """out[o] = acc[o] * scale[o] * x_factor (+ bias): int8 rows times fixed-point activations."""
    rows_dot_i8(acc, w, w_off, xq, n_out, n_in)
    for o in range(n_out):
        y = acc[o] * (p[s_off + o] * x_factor)
        out[o] = y + p[b_off + o] if b_off >= 0 else y


def rotate(v, off, cos, sin, t_off, half):
    """GPT-NeoX rotary on v[off : off + 2*half] (rotate_half pairs i with i + half), angles at cos/sin[t_off:]."""
    for i in range(half):
        a = v[off + i]
        b = v[off + half + i]
        c = cos[t_off + i]
        s = sin[t_off + i]
        v[off + i] = a * c - b * s
        v[off + half + i] = b * c + a * s


def attend(out, q, kc, vc, base, t, heads, hd, stride, scores, scale, ks, vs, s_base):
    """Causal attention of one query over cached positions 0..t (K/V rows at base + j*stride).

    ks/vs: per-position scales of an integer cache (row j is kc[row] * ks[s_base + j]), or None
    for a float cache.
    """
    for h in range(heads):
        qo = h * hd
        best = -1e30
        k = base + qo
        for j in range(t + 1):
            s = 0.0
            for e in range(hd):
                s += q[qo + e] * kc[k + e]
            s *= scale if ks is None else scale * ks[s_base + j]
            scores[j] = s
            if s > best:
                best = s
            k += stride
        total = 0.0
        for j in range(t + 1):
            e = math.exp(scores[j] - best)
            total += e
            scores[j] = e if vs is None else e * vs[s_base + j]  # folds the V row's scale into its weight
        for e in range(hd):
            s = 0.0
            k = base + qo + e
            for j in range(t + 1):
                s += scores[j] * vc[k]
                k += stride
            out[qo + e] = s / total
