"""Viper versions of intkernels.py's integer kernels, for ports with native emitters (the RP2040's).

Imported under try/except by intkernels.py: CPython has no `micropython` module and the WebAssembly
port rejects viper at compile time; both keep the plain-Python twins, which compute the same ints.
Everything here is 32-bit machine words. ptr8/ptr16 read unsigned, so the int16 cache is sign-extended
by hand. The int8 matrix-vector product, most of a token's cycles, is in matvec_native.py.
"""
import micropython


@micropython.viper
def quantize(dst: ptr32, d_off: int, src: ptr32, off: int, n: int, limit: int) -> int:  # noqa: F821
    m = 0
    for i in range(n):
        v = src[off + i]
        if v < 0:
            v = 0 - v
        if v > m:
            m = v
    s = 0
    while (m >> s) > limit:
        s += 1
    half = (1 << s) >> 1
    for i in range(n):
        dst[d_off + i] = (src[off + i] + half) >> s
    return s


@micropython.viper
def store16(dst: ptr16, d_off: int, src: ptr32, n: int):  # noqa: F821
    for i in range(n):
        dst[d_off + i] = src[i]


@micropython.viper
def embed(x: ptr32, w: ptr8, k: int, step: int, flip: int, d: int, mult: int, s: int):  # noqa: F821
    for i in range(d):
        y = ((w[k + step * i] ^ flip) - 128) * mult
        if s >= 0:
            x[i] = y >> s
        else:
            x[i] = y << (0 - s)


@micropython.viper
def residual(x: ptr32, a: ptr32, b: ptr32, d: int, both: bool):  # noqa: F821
    if both:
        for i in range(d):
            x[i] += a[i] + b[i]
    else:
        for i in range(d):
            x[i] += a[i]


@micropython.viper
def layernorm(out: ptr32, x: ptr32, d: int, p: ptr32, g_off: int, b_off: int, shift: int, eps: int,  # noqa: F821
              bits: int):
    s = 0
    for i in range(d):
        s += x[i]
    mean = s // d
    m = 0
    for i in range(d):
        c = x[i] - mean
        out[i] = c
        if c < 0:
            c = 0 - c
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
    v = ss // d + (eps >> (2 * k))
    r = 0
    bit = 1 << 28
    while bit > v:
        bit >>= 2
    while bit:
        if v >= r + bit:
            v -= r + bit
            r = (r >> 1) + bit
        else:
            r >>= 1
        bit >>= 2
    if r == 0:
        r = 1
    down = shift - 4  # ACT_FRAC - NORM_FRAC
    for i in range(d):
        nq = ((out[i] >> k) << 12) // r
        out[i] = ((nq * p[g_off + i]) >> down) + p[b_off + i]


@micropython.viper
def gelu(x: ptr32, n: int, t: ptr32, t_off: int):  # noqa: F821
    top = 512 << 10
    for i in range(n):
        u = x[i] + (4 << 16)
        if u < 0:
            x[i] = 0
        elif u < top:
            j = t_off + (u >> 10)
            a = t[j]
            x[i] = a + (((t[j + 1] - a) * (u & 1023)) >> 10)


@micropython.viper
def rotate(v: ptr32, off: int, heads: int, hd: int, half: int, t: ptr32, c_off: int, s_off: int):  # noqa: F821
    for h in range(heads):
        o = off + h * hd
        for i in range(half):
            a = v[o + i]
            b = v[o + half + i]
            c = t[c_off + i]
            s = t[s_off + i]
            v[o + i] = (a * c - b * s) >> 14
            v[o + half + i] = (b * c + a * s) >> 14


@micropython.viper
def attend(out: ptr32, q: ptr32, sq: int, kc: ptr16, vc: ptr16, base: int, pos: int, heads: int,  # noqa: F821
           hd: int, d: int, ks: ptr8, vs: ptr8, srow: int, w: ptr32, t: ptr32, e_off: int):  # noqa: F821
    for h in range(heads):
        o = h * hd
        top = 0 - (1 << 30)
        k = base + o
        for j in range(pos + 1):
            raw = 0
            for e in range(hd):
                raw += q[o + e] * (((kc[k + e]) ^ 32768) - 32768)
            n = 22 - sq - ks[srow + j]
            if n >= 0:
                z = raw >> n
            else:
                z = raw << (0 - n)
            w[j] = z
            if z > top:
                top = z
            k += d
        total = 0
        for j in range(pos + 1):
            u = top - w[j]
            p = 0
            if u < 15360:  # EXP_CUT
                y = (u * 23637) >> 14  # LOG2E
                if y < 15360:
                    i = e_off + ((y & 1023) >> 4)
                    a = t[i]
                    p = (a + (((t[i + 1] - a) * (y & 15)) >> 4)) >> (y >> 10)
            w[j] = p
            total += p
        for j in range(pos + 1):
            w[j] = (w[j] << 15) // total
        for e in range(hd):
            acc = 0
            k = base + o + e
            for j in range(pos + 1):
                y = w[j] * ((vc[k] ^ 32768) - 32768)
                n = 11 - vs[srow + j]
                if n >= 0:
                    acc += y >> n
                else:
                    acc += y << (0 - n)
                k += d
            out[o + e] = acc >> 4


@micropython.viper
def argmax(z: ptr32, n: int) -> int:  # noqa: F821
    best = z[0]
    arg = 0
    pz = uint(z)
    end = pz + 4 * n
    i = 0
    while pz < end:  # walking the address: fewer cycles per element than z[i]
        v = ptr32(pz)[0]  # noqa: F821
        if v > best:
            best = v
            arg = i
        i += 1
        pz += 4
    return arg


@micropython.viper
def kth_largest(z: ptr32, n: int, k: int, heap: ptr32) -> int:  # noqa: F821
    for i in range(k):
        v = z[i]
        j = i
        while j > 0:
            up = (j - 1) >> 1
            if heap[up] <= v:
                break
            heap[j] = heap[up]
            j = up
        heap[j] = v
    root = heap[0]
    pz = uint(z) + 4 * k
    end = uint(z) + 4 * n
    while pz < end:
        v = ptr32(pz)[0]  # noqa: F821
        pz += 4
        if v <= root:
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
        root = heap[0]
    return root


@micropython.viper
def draw(z: ptr32, n: int, top: int, tau: int, inv_t: int, t: ptr32, e_off: int, rng: ptr32) -> int:  # noqa: F821
    x = uint(rng[0])
    x ^= x << 13
    x ^= x >> 17
    x ^= x << 5
    rng[0] = int(x)
    r = int(x >> 2)
    total = 0
    for rep in range(2):  # pass 0 sums the weights, pass 1 finds where the draw falls
        if rep:
            r = r % total
        acc = 0
        pz = uint(z)
        end = pz + 4 * n
        while pz < end:
            v = ptr32(pz)[0]  # noqa: F821
            pz += 4
            if v < tau:
                continue
            d6 = (top - v) >> 6
            if d6 >= 65536:
                continue
            u = (d6 * inv_t) >> 12
            if u >= 15360:
                continue
            y = (u * 23637) >> 14
            if y >= 15360:
                continue
            j = e_off + ((y & 1023) >> 4)
            a = t[j]
            acc += (a + (((t[j + 1] - a) * (y & 15)) >> 4)) >> (y >> 10)
            if rep and acc > r:
                return int(pz - uint(z)) // 4 - 1
        total = acc
    return 0
