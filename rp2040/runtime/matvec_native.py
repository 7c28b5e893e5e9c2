"""The int8 matrix-vector product for ports with native emitters (the RP2040's): asm_thumb for the Cortex-M0+.

intkernels.matvec's contract and integers (rp2040/FORMAT.md, spec rp2040/reference.py), in two passes over
the rows: `dots` (the sums) and `requantize` (floor(sum * m / 2**shift) + bias, with the sum split into 15-bit
halves so every product fits 32 bits), 8.4 cycles per multiply-add against 36 for the viper loops that remain
for rows that are not word aligned and shifts outside 0..46 (benchmarks/bench_pico_kernels.py). Imported under
try/except by intkernels.py, as kernels_native.py is: CPython and the WebAssembly port keep the plain loop.
"""
import micropython
from array import array

from .matvec_asm import matvec4 as asm_matvec4

JOB = array("i", [0, 0, 0, 0])  # matvec4's job for the asm: dims, multipliers, biases, shift


@micropython.asm_thumb
def dots(r0, r1, r2, r3):
    # out[o] = sum_i w[o*n_in + i] * x[i] for each row: r0 out (int32), r1 the rows (int8, word aligned),
    # r2 x (int32), r3 = n_out << 16 | n_in (both >= 1, n_in a multiple of 4). One word holds four
    # weights, sign-extended from it in registers: 29 cycles per word on the Cortex-M0+ (7.8 per
    # multiply-add with the per-row work at 80 inputs, against 36 for the viper loops below).
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
def requantize_viper(out: ptr32, n_out: int, p: ptr32, m_off: int, shift: int, b_off: int):  # noqa: F821
    # requantize's arithmetic for any shift, in viper: the fallback for shifts outside asm_thumb's 0..46
    for o in range(n_out):
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
    requantize_viper(out, n_out, p, m_off, shift, b_off)  # shifts beyond those fields (negative, or above 46)


@micropython.viper
def matvec4(out: ptr32, w: ptr8, w_off: int, xq: ptr32, n_out: int, n_in: int, p: ptr32, m_off: int,  # noqa: F821
            shift: int, b_off: int):
    # intkernels.matvec4 (4-row interleaved weights): the sums and, for shifts 0..46, the requantization in one
    # asm_thumb call (matvec_asm.py, 3.6 cycles per multiply-add in its loop); other shifts in viper here.
    job = ptr32(JOB)  # noqa: F821
    job[0] = (n_out << 16) | n_in
    job[1] = int(uint(p)) + 4 * m_off
    job[2] = int(uint(p)) + 4 * b_off if b_off >= 0 else 0
    job[3] = shift
    asm_matvec4(out, uint(w) + w_off, xq, JOB)
    if shift >= 0 and shift <= 46:
        return
    requantize_viper(out, n_out, p, m_off, shift, b_off)  # the asm left the sums
