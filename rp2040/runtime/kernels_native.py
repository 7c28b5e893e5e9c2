"""Viper and asm_thumb versions of intkernels.py's integer kernels, for ports with native emitters (the RP2040's).

Imported under try/except by intkernels.py: CPython has no `micropython` module and the WebAssembly
port rejects viper and asm_thumb at compile time; both keep the plain-Python twins, which compute the
same ints. Everything here is 32-bit machine words. ptr8/ptr16 read unsigned, so int8 weights and the
int16 cache are sign-extended by hand; products that could pass 32 bits are split (see matvec). The
int8 matrix-vector products, most of a token's cycles, are Cortex-M0+ assembly (`dots`, then
`requantize`): 8.4 cycles per multiply-add against viper's 37 (benchmarks/bench_pico_kernels.py).
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


@micropython.asm_thumb
def dots(r0, r1, r2, r3):
    # out[o] = sum_i w[o*n_in + i] * x[i] for each row: r0 out (int32), r1 the rows (int8, word aligned),
    # r2 x (int32), r3 = n_out << 16 | n_in (both >= 1, n_in a multiple of 4). One word holds four
    # weights, sign-extended from it in registers: 29 cycles per word on the Cortex-M0+ (7.8 per
    # multiply-add with the per-row work at 80 inputs, against 37 for the viper loops below).
    label(ROW)
    push({r0, r3})  # r0 and r3 serve as scratch inside a row
    lsl(r3, r3, 16)
    lsr(r3, r3, 14)
    add(r3, r2, r3)  # r3: end of x
    mov(r5, r2)  # r5: x walking
    mov(r4, 0)  # r4: the sum
    label(WORD)
    ldr(r6, [r1, 0])  # r6: w[i..i+3]
    add(r1, 4)
    ldr(r7, [r5, 0])
    data(2, 0xB270)  # sxtb r0, r6 (the inline assembler has no sxtb)
    mul(r0, r7)
    add(r4, r4, r0)
    ldr(r7, [r5, 4])
    lsl(r0, r6, 16)
    asr(r0, r0, 24)
    mul(r0, r7)
    add(r4, r4, r0)
    ldr(r7, [r5, 8])
    lsl(r0, r6, 8)
    asr(r0, r0, 24)
    mul(r0, r7)
    add(r4, r4, r0)
    ldr(r7, [r5, 12])
    asr(r0, r6, 24)
    mul(r0, r7)
    add(r4, r4, r0)
    add(r5, 16)
    cmp(r5, r3)
    bne(WORD)
    pop({r0, r3})
    str(r4, [r0, 0])
    add(r0, 4)
    mov(r6, 1)
    lsl(r6, r6, 16)
    sub(r3, r3, r6)  # one row fewer
    lsr(r6, r3, 16)
    bne(ROW)


@micropython.asm_thumb
def requantize(r0, r1, r2, r3):
    # In place, each row's sum to floor(acc * m / 2**shift) (+ bias), as matvec's viper loop computes it:
    # r0 the sums (int32), r1 the row multipliers, r2 the biases (0: none), r3 = n_out << 16 | u << 10 |
    # v << 5 | w with y = (((hi * m) << u) + ((lo * m) >> v)) >> w, acc = hi * 2**15 + lo.
    label(ROW)
    ldr(r4, [r0, 0])
    ldr(r6, [r1, 0])  # r6: m
    add(r1, 4)
    lsl(r5, r4, 17)
    lsr(r5, r5, 17)  # r5: lo
    asr(r4, r4, 15)  # r4: hi
    mul(r5, r6)
    mul(r4, r6)
    lsl(r7, r3, 17)
    lsr(r7, r7, 27)
    lsl(r4, r7)  # << u
    lsl(r7, r3, 22)
    lsr(r7, r7, 27)
    asr(r5, r7)  # >> v
    add(r4, r4, r5)
    lsl(r7, r3, 27)
    lsr(r7, r7, 27)
    asr(r4, r7)  # >> w
    cmp(r2, 0)
    beq(STORE)
    ldr(r7, [r2, 0])
    add(r4, r4, r7)
    add(r2, 4)
    label(STORE)
    str(r4, [r0, 0])
    add(r0, 4)
    mov(r7, 1)
    lsl(r7, r7, 16)
    sub(r3, r3, r7)  # one row fewer
    lsr(r7, r3, 16)
    bne(ROW)


@micropython.viper
def matvec(out: ptr32, w: ptr8, w_off: int, xq: ptr32, n_out: int, n_in: int, p: ptr32, m_off: int,  # noqa: F821
           shift: int, b_off: int):
    pw = uint(w) + w_off
    rows16 = n_out > 0 and n_out < 65536  # the asm_thumb functions count rows in 16 bits
    if rows16 and n_in < 65536 and ((int(pw) | n_in) & 3) == 0:
        dots(out, pw, xq, (n_out << 16) | n_in)  # the sums by asm_thumb
    else:  # rows that are not word aligned: viper, four products per step (half the cycles of indexing)
        n4 = (n_in >> 2) << 2
        for o in range(n_out):
            acc = 0
            px = uint(xq)
            end = pw + n4
            while pw < end:
                a = ptr8(pw)  # noqa: F821
                b = ptr32(px)  # noqa: F821
                acc += (((a[0] ^ 128) - 128) * b[0] + ((a[1] ^ 128) - 128) * b[1]
                        + ((a[2] ^ 128) - 128) * b[2] + ((a[3] ^ 128) - 128) * b[3])
                pw += 4
                px += 16
            end += n_in - n4
            while pw < end:
                a = ptr8(pw)  # noqa: F821
                b = ptr32(px)  # noqa: F821
                acc += ((a[0] ^ 128) - 128) * b[0]
                pw += 1
                px += 4
            out[o] = acc
    # floor(acc * m / 2**shift) in 32 bits: acc = hi * 2**15 + lo, |hi * m| and lo * m < 2**30
    if rows16 and shift >= 0 and shift <= 46:  # by asm_thumb: the shift counts fit its 5-bit fields
        bias = int(uint(p)) + 4 * b_off if b_off >= 0 else 0
        if shift >= 15:
            code = (15 << 5) | (shift - 15)
        else:
            code = ((15 - shift) << 10) | (shift << 5)
        requantize(out, int(uint(p)) + 4 * m_off, bias, (n_out << 16) | code)
        return
    for o in range(n_out):  # shifts beyond those fields (negative, or above 46) in viper
        acc = out[o]
        m = p[m_off + o]
        hi = acc >> 15
        lo = (acc & 32767) * m
        if shift >= 15:
            y = (hi * m + (lo >> 15)) >> (shift - 15)
        else:
            y = ((hi * m) << (15 - shift)) + (lo << (0 - shift))
        if b_off >= 0:
            y += p[b_off + o]
        out[o] = y


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
