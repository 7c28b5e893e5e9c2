"""Integer kernels of the int8 forward pass and sampler: the plain-Python twin of kernels_native.py (viper)
and matvec_native.py (asm_thumb).

All compute rp2040/FORMAT.md's integer arithmetic (spec: rp2040/reference.py), so they give the same
integers. On the RP2040 the native versions replace these (see the import at the end); CPython and the
WebAssembly port, which has no native emitter, run these. Arrays are preallocated `array`s: "i" int32
activations and P values, "b" int8 weights, "h" int16 KV cache, "b" per-row cache shifts.
"""
from .fixed import ACT_FRAC, EXP_CUT, EXP_FRAC, GELU_LO, GELU_STEP_BITS, LOG2E, NORM_FRAC, ROPE_FRAC, isqrt


def quantize(dst, d_off, src, off, n, limit):
    """dst[d_off:][:n] = src[off:][:n] shifted right (rounding) by the smallest s >= 0 that brings
    max|x| to at most `limit`; returns s."""
    m = 0
    for i in range(n):
        v = src[off + i]
        if v < 0:
            v = -v
        if v > m:
            m = v
    s = 0
    while (m >> s) > limit:
        s += 1
    half = (1 << s) >> 1
    for i in range(n):
        dst[d_off + i] = (src[off + i] + half) >> s
    return s


def store16(dst, d_off, src, n):
    """dst[d_off:][:n] = src[:n] (int32 values that fit int16, into the int16 KV cache)."""
    for i in range(n):
        dst[d_off + i] = src[i]


def matvec(out, w, w_off, xq, n_out, n_in, p, m_off, shift, b_off):
    """out[o] = floor(sum_i w[w_off + o*n_in + i] * xq[i] * p[m_off + o] / 2**shift) (+ p[b_off + o] if
    b_off >= 0): int8 rows times shifted activations, requantized by the row multiplier."""
    k = w_off
    for o in range(n_out):
        acc = 0
        for i in range(n_in):
            acc += w[k + i] * xq[i]
        y = acc * p[m_off + o]
        y = y >> shift if shift >= 0 else y << -shift
        out[o] = y + p[b_off + o] if b_off >= 0 else y
        k += n_in


def matvec4(out, w, w_off, xq, n_out, n_in, p, m_off, shift, b_off):
    """matvec's integers over weights stored 4 rows interleaved (model.bin v4): row o's byte at column i is
    w[w_off + (o >> 2) * 4 * n_in + 4 * i + (o & 3)], holding q + 128 (read back as q = (byte & 255) - 128)."""
    for o in range(n_out):
        k = w_off + (o >> 2) * 4 * n_in + (o & 3)
        acc = 0
        for i in range(n_in):
            acc += ((w[k + 4 * i] & 255) - 128) * xq[i]
        y = acc * p[m_off + o]
        y = y >> shift if shift >= 0 else y << -shift
        out[o] = y + p[b_off + o] if b_off >= 0 else y


def embed(x, w, k, step, flip, d, mult, s):
    """x[i] = (q * mult) >> s (<< -s when s < 0) with q the byte w[k + step * i] as int8: `flip` 128 for
    row-major tables (signed bytes), 0 for interleaved ones (bytes q + 128)."""
    for i in range(d):
        y = ((((w[k + step * i]) & 255) ^ flip) - 128) * mult
        x[i] = y >> s if s >= 0 else y << -s


def residual(x, a, b, d, both):
    """x += a (+ b when `both`)."""
    for i in range(d):
        x[i] += a[i] + b[i] if both else a[i]


def layernorm(out, x, d, p, g_off, b_off, shift, eps, bits):
    """Integer LayerNorm: out = (x - mean) / sqrt(var + eps) * gamma + beta, all in ints (FORMAT.md)."""
    s = 0
    for i in range(d):
        s += x[i]
    mean = s // d
    m = 0
    for i in range(d):
        c = x[i] - mean
        out[i] = c
        if c < 0:
            c = -c
        if c > m:
            m = c
    if m == 0:
        for i in range(d):
            out[i] = p[b_off + i]
        return
    k = 0
    while (m >> k) >> bits:
        k += 1
    ss = 0
    for i in range(d):
        c = out[i] >> k
        ss += c * c
    r = isqrt(ss // d + (eps >> (2 * k))) or 1
    down = shift - (ACT_FRAC - NORM_FRAC)
    for i in range(d):
        nq = ((out[i] >> k) << NORM_FRAC) // r
        out[i] = ((nq * p[g_off + i]) >> down) + p[b_off + i]


def gelu(x, n, t, t_off):
    """In place: GELU from the table t[t_off:] (2**-6 steps over [-4, 4), linear in between)."""
    top = (512 << GELU_STEP_BITS)
    low = GELU_LO << ACT_FRAC
    mask = (1 << GELU_STEP_BITS) - 1
    for i in range(n):
        u = x[i] - low
        if u < 0:
            x[i] = 0
        elif u < top:
            j = t_off + (u >> GELU_STEP_BITS)
            a = t[j]
            x[i] = a + (((t[j + 1] - a) * (u & mask)) >> GELU_STEP_BITS)


def rotate(v, off, heads, hd, half, t, c_off, s_off):
    """Rotary in place on each head's first 2*half dims of v[off:] (rotate_half pairs i and i + half);
    cos and sin of this position are t[c_off:], t[s_off:] (Q14)."""
    for h in range(heads):
        o = off + h * hd
        for i in range(half):
            a = v[o + i]
            b = v[o + half + i]
            c = t[c_off + i]
            s = t[s_off + i]
            v[o + i] = (a * c - b * s) >> ROPE_FRAC
            v[o + half + i] = (b * c + a * s) >> ROPE_FRAC


def attend(out, q, sq, kc, vc, base, pos, heads, hd, d, ks, vs, srow, w, t, e_off):
    """Causal attention of the rotated int query q (shift sq) over cache rows 0..pos (K, V rows at
    base + j*d, their shifts ks/vs[srow + j]); exp from the table t[e_off:]; w holds pos + 1 weights.
    out = attention output in Q16."""
    for h in range(heads):
        o = h * hd
        top = -(1 << 30)
        k = base + o
        for j in range(pos + 1):
            raw = 0
            for e in range(hd):
                raw += q[o + e] * kc[k + e]
            n = 22 - sq - ks[srow + j]
            z = raw >> n if n >= 0 else raw << -n
            w[j] = z
            if z > top:
                top = z
            k += d
        total = 0
        for j in range(pos + 1):
            u = top - w[j]
            p = 0
            if u < EXP_CUT:
                y = (u * LOG2E) >> 14
                if y < EXP_CUT:
                    i = e_off + ((y & 1023) >> 4)
                    a = t[i]
                    p = (a + (((t[i + 1] - a) * (y & 15)) >> 4)) >> (y >> 10)
            w[j] = p
            total += p
        for j in range(pos + 1):
            w[j] = (w[j] << EXP_FRAC) // total
        for e in range(hd):
            acc = 0
            k = base + o + e
            for j in range(pos + 1):
                y = w[j] * vc[k]
                n = 11 - vs[srow + j]
                acc += y >> n if n >= 0 else y << -n
                k += d
            out[o + e] = acc >> 4


def argmax(z, n):
    """Index of the largest of z[:n] (the first on ties, like torch.argmax)."""
    best, arg = z[0], 0
    for i in range(1, n):
        if z[i] > best:
            best, arg = z[i], i
    return arg


def kth_largest(z, n, k, heap):
    """The k-th largest of z[:n] (0 < k <= n) in one pass: heap[:k] is a min-heap of the k largest so far."""
    for i in range(k):  # the first k, each sifted up
        v = z[i]
        j = i
        while j > 0:
            up = (j - 1) >> 1
            if heap[up] <= v:
                break
            heap[j] = heap[up]
            j = up
        heap[j] = v
    for i in range(k, n):  # a larger value replaces the root and sifts down
        v = z[i]
        if v <= heap[0]:
            continue
        j = 0
        c = 1
        while c < k:
            if c + 1 < k and heap[c + 1] < heap[c]:
                c += 1
            if heap[c] >= v:
                break
            heap[j] = heap[c]
            j = c
            c = 2 * j + 1
        heap[j] = v
    return heap[0]


def draw(z, n, top, tau, inv_t, t, e_off, rng):
    """Sample an index of z[:n] with weight exp((z - top) / T) (the exp table, Q15) among z >= tau;
    rng[0] is the xorshift32 state, advanced once."""
    x = rng[0]
    x ^= (x << 13) & 0xFFFFFFFF
    x ^= x >> 17
    x ^= (x << 5) & 0xFFFFFFFF
    rng[0] = x
    total = 0
    for rep in range(2):  # pass 0 sums the weights, pass 1 finds where the draw falls
        if rep:
            r = (x >> 2) % total
        acc = 0
        for i in range(n):
            v = z[i]
            if v < tau:
                continue
            d6 = (top - v) >> 6
            if d6 >= 65536:
                continue
            u = (d6 * inv_t) >> 12
            if u >= EXP_CUT:
                continue
            y = (u * LOG2E) >> 14
            if y >= EXP_CUT:
                continue
            j = e_off + ((y & 1023) >> 4)
            a = t[j]
            acc += (a + (((t[j + 1] - a) * (y & 15)) >> 4)) >> (y >> 10)
            if rep and acc > r:
                return i
        total = acc
    return argmax(z, n)  # unreachable: the top token has weight 2**15


try:
    from .kernels_native import (argmax, attend, draw, embed, gelu, kth_largest, layernorm,  # noqa: F811
                                 quantize, residual, rotate, store16)
    from .matvec_native import matvec, matvec4  # noqa: F811
except (ImportError, SyntaxError):
    pass  # CPython, or a port without native emitters (WebAssembly): keep the plain loops
