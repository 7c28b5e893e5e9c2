"""The integer operations of the host reference (rp2040/reference.py), vectorised in numpy: rp2040/FORMAT.md's
arithmetic, each intermediate checked to fit the 32-bit signed word the device computes in."""
from __future__ import annotations

import numpy as np

from rp2040.runtime import fixed as fx

LIMIT = 2 ** 31


def fits(a: np.ndarray, what: str) -> np.ndarray:
    """`a`, after checking each value fits a 32-bit signed word (else OverflowError naming `what`)."""
    if a.size and np.abs(a).max() >= LIMIT:
        raise OverflowError(f"{what} leaves the 32-bit range the device computes in")
    return a


def shr(v: np.ndarray, n) -> np.ndarray:
    """floor(v / 2**n), or v * 2**-n for negative n (elementwise n allowed)."""
    n = np.asarray(n, np.int64)
    return np.where(n >= 0, v >> np.maximum(n, 0), v << np.maximum(-n, 0))


def bitlen(v: np.ndarray) -> np.ndarray:
    return np.frexp(np.asarray(v, np.float64))[1].astype(np.int64)  # exact below 2**53


def quantize(x: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row shifted right (rounding) by the smallest s >= 0 with max|row| >> s <= limit: (ints, s)."""
    m = np.abs(x).max(-1)
    s = np.maximum(bitlen(m) - bitlen(np.int64(limit)), 0)  # fewer bits would leave m above the limit
    s = s + ((m >> s) > limit)  # same bit length as the limit but larger
    half = (np.int64(1) << s) >> 1
    return (x + half[..., None]) >> s[..., None], s


def mulshr(a: np.ndarray, m: np.ndarray, n) -> np.ndarray:
    """floor(a * m / 2**n): the device splits a into 15-bit halves to compute it in 32 bits."""
    return fits(shr(a * m, n), "a requantized output")


def linear(x: np.ndarray, w: np.ndarray, mult: np.ndarray, shift: int, bias: np.ndarray | None) -> np.ndarray:
    xq, s = quantize(x, fx.input_limit(w.shape[1]))
    acc = fits(xq @ w.T.astype(np.int64), "an int8 dot product")
    y = mulshr(acc, mult, shift - s[..., None])
    return y if bias is None else fits(y + bias, "a linear output")


def layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray, shift: int, eps: int) -> np.ndarray:
    d = x.shape[-1]
    mean = fits(x.sum(-1), "a norm's sum") // d
    c = x - mean[..., None]
    m = np.abs(c).max(-1)
    k = np.maximum(bitlen(m) - fx.norm_bits(d), 0)
    cs = c >> k[..., None]
    var = fits((cs * cs).sum(-1), "a norm's sum of squares") // d
    v = var + (eps >> (2 * k))
    sigma = np.floor(np.sqrt(v.astype(np.float64))).astype(np.int64)
    sigma -= sigma * sigma > v
    sigma += (sigma + 1) * (sigma + 1) <= v
    sigma = np.maximum(sigma, 1)
    nq = (cs << fx.NORM_FRAC) // sigma[..., None]
    out = ((nq * g) >> (shift - (fx.ACT_FRAC - fx.NORM_FRAC))) + b
    return fits(np.where((m == 0)[..., None], b, out), "a norm's output")


def gelu(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    u = x - (fx.GELU_LO << fx.ACT_FRAC)
    inside = (u >= 0) & (u < (len(table) - 1) << fx.GELU_STEP_BITS)
    j = np.clip(u >> fx.GELU_STEP_BITS, 0, len(table) - 2)
    f = u & ((1 << fx.GELU_STEP_BITS) - 1)
    y = table[j] + (((table[j + 1] - table[j]) * f) >> fx.GELU_STEP_BITS)
    return np.where(inside, y, np.where(u < 0, 0, x))


def exp_q15(u: np.ndarray, table: np.ndarray) -> np.ndarray:
    """2**15 * exp(-u / 2**10) for u >= 0: exp table in log2 steps of 1/64, linear in between."""
    cut = u >= fx.EXP_CUT
    y = (np.where(cut, 0, u) * fx.LOG2E) >> 14
    i = (y & 1023) >> 4
    f = y & 15
    p = (table[i] + (((table[i + 1] - table[i]) * f) >> 4)) >> np.minimum(y >> 10, 31)
    return np.where(cut | (y >= fx.EXP_CUT), 0, p)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """Rotary on the first 2*half dims of each head (rotate_half pairing), Q14 tables [T, half]."""
    half = cos.shape[1]
    out = x.copy()
    for h in range(heads):
        a = x[:, h * head_dim:h * head_dim + half]
        b = x[:, h * head_dim + half:h * head_dim + 2 * half]
        out[:, h * head_dim:h * head_dim + half] = (a * cos - b * sin) >> fx.ROPE_FRAC
        out[:, h * head_dim + half:h * head_dim + 2 * half] = (b * cos + a * sin) >> fx.ROPE_FRAC
    return out
