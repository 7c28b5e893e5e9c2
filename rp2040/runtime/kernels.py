"""Float kernels of the f32 forward pass, in plain Python that MicroPython and CPython both run.

Buffers are preallocated `array`s; kernels write into `out` and never build lists. Weights are
addressed as (buffer, element offset) so one kernel serves resident and streamed layers. On an
RP2040 every float result is a heap object: int8 models use intkernels.py instead.
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


def rotate(v, off, cos, sin, t_off, half):
    """GPT-NeoX rotary on v[off : off + 2*half] (rotate_half pairs i with i + half), angles at cos/sin[t_off:]."""
    for i in range(half):
        a = v[off + i]
        b = v[off + half + i]
        c = cos[t_off + i]
        s = sin[t_off + i]
        v[off + i] = a * c - b * s
        v[off + half + i] = b * c + a * s


def attend(out, q, kc, vc, base, t, heads, hd, stride, scores, scale):
    """Causal attention of one query over cached positions 0..t (K/V rows at base + j*stride)."""
    for h in range(heads):
        qo = h * hd
        best = -1e30
        k = base + qo
        for j in range(t + 1):
            s = 0.0
            for e in range(hd):
                s += q[qo + e] * kc[k + e]
            s *= scale
            scores[j] = s
            if s > best:
                best = s
            k += stride
        total = 0.0
        for j in range(t + 1):
            e = math.exp(scores[j] - best)
            total += e
            scores[j] = e
        for e in range(hd):
            s = 0.0
            k = base + qo + e
            for j in range(t + 1):
                s += scores[j] * vc[k]
                k += stride
            out[qo + e] = s / total
