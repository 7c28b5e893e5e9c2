@ The Pico's int8 dot products over weights stored 4 rows interleaved (rp2040/FORMAT.md, model.bin v4), for the
@ Cortex-M0+ (ARMv6-M, Thumb-1). Assembled by `python -m rp2040.asm_build` into rp2040/runtime/matvec_asm.py as
@ data() halfwords of @micropython.asm_thumb functions: each section below is one function's body. The
@ MicroPython prologue has pushed r4-r7 and lr and its epilogue returns, so a body ends by falling off its
@ end, and saves r8-r11 itself. No literal pools: a body's load address is only halfword aligned.
@
@ Block b holds rows 4b..4b+3: its word i is the 4 rows' bytes at column i (row 4b+r in byte r), each byte
@ u = w + 128. With W that word and x the column's input, four running sums
@   A += (W >> 24) x,  B += (W >> 16) x,  C += (W >> 8) x,  D += W x    (mod 2^32)
@ give U3 = A, U2 = B - 256 A, U1 = C - 256 B, U0 = D - 256 C, where U_r = sum_i u_r x_i, and each row's
@ sum is U_r - 128 sum(x): exact while |U_r| <= 255 sum|x| < 2^31, which FORMAT.md's input limit
@ (|x| <= 2^29 / (127 n_in)) keeps.

    .syntax unified
    .cpu cortex-m0plus
    .thumb

@ matvec4(r0 out int32[n_out], r1 blocks (word aligned), r2 x int32[n_in], r3 job int32[4]):
@ job = [n_out << 16 | n_in, address of the row multipliers m, address of the biases (0: none), shift].
@ out[o] = sum_i w[o, i] x[i], then, for shifts 0..46, floor(out[o] m[o] / 2^shift) (+ bias[o]) in place, as
@ matvec_native.requantize computes it: with sum = hi 2^15 + lo, y = ((hi m) << (15 - shift)) + ((lo m) >> shift)
@ below 15, else (hi m + ((lo m) >> 15)) >> (shift - 15). Other shifts leave the sums for the caller.
@ n_out a multiple of 4, n_in a multiple of 8, both nonzero.
    .section .text.matvec4, "ax"
matvec4:
    mov r4, r8
    mov r5, r9
    mov r6, r10
    mov r7, r11
    push {r4-r7}
    push {r0, r3}           @ out, job
    ldr r3, [r3, #0]
    lsls r4, r3, #16
    lsrs r4, r4, #14
    adds r4, r2, r4
    mov r12, r4             @ r12: end of x
    movs r6, #0             @ r6: sum(x)
    mov r5, r2
1:  ldm r5!, {r4, r7}
    adds r6, r6, r4
    adds r6, r6, r7
    cmp r5, r12
    bne 1b
    lsls r6, r6, #7         @ 128 sum(x)
    lsrs r3, r3, #18        @ blocks of 4 rows
    push {r2, r3, r6}       @ [sp] x, [sp, 4] blocks left, [sp, 8] 128 sum(x)
2:  movs r3, #0
    mov r8, r3
    mov r9, r3
    mov r10, r3
    mov r11, r3
    ldr r2, [sp, #0]
3:
    .rept 4                 @ 8 columns per pass: two words of the block, two inputs at a time
    ldm r1!, {r4, r5}
    ldm r2!, {r6, r7}
    lsrs r3, r4, #24
    muls r3, r6
    add r8, r3
    lsrs r3, r4, #16
    muls r3, r6
    add r9, r3
    lsrs r3, r4, #8
    muls r3, r6
    add r10, r3
    muls r4, r6
    add r11, r4
    lsrs r3, r5, #24
    muls r3, r7
    add r8, r3
    lsrs r3, r5, #16
    muls r3, r7
    add r9, r3
    lsrs r3, r5, #8
    muls r3, r7
    add r10, r3
    muls r5, r7
    add r11, r5
    .endr
    cmp r2, r12
    bne 3b
    mov r7, r8              @ A
    mov r6, r9              @ B
    mov r5, r10             @ C
    mov r4, r11             @ D
    lsls r2, r5, #8
    subs r4, r4, r2         @ U0 = D - 256 C
    lsls r2, r6, #8
    subs r5, r5, r2         @ U1 = C - 256 B
    lsls r2, r7, #8
    subs r6, r6, r2         @ U2 = B - 256 A
    ldr r3, [sp, #8]
    subs r4, r4, r3
    subs r5, r5, r3
    subs r6, r6, r3
    subs r7, r7, r3
    stm r0!, {r4-r7}        @ rows 4b .. 4b+3
    ldr r3, [sp, #4]
    subs r3, #1
    str r3, [sp, #4]
    bne 2b
    add sp, #12
    pop {r0, r3}            @ out, job
    ldr r4, [r3, #12]       @ shift
    cmp r4, #46
    bhi 9f                  @ negative (unsigned: huge) or above 46: the caller requantizes
    ldr r1, [r3, #4]        @ r1: row multipliers
    ldr r2, [r3, #8]        @ r2: biases or 0
    ldr r3, [r3, #0]
    lsrs r3, r3, #16        @ r3: rows left
    movs r7, r4
    subs r7, #15            @ r7: shift - 15
    blt 7f
    cmp r2, #0
    beq 5f
4:  ldr r4, [r0, #0]        @ shift >= 15, with biases
    ldm r1!, {r6}
    lsls r5, r4, #17
    lsrs r5, r5, #17        @ lo
    asrs r4, r4, #15        @ hi
    muls r5, r6
    muls r4, r6
    asrs r5, r5, #15
    adds r4, r4, r5
    asrs r4, r7
    ldm r2!, {r6}
    adds r4, r4, r6
    stm r0!, {r4}
    subs r3, #1
    bne 4b
    b 9f
5:  ldr r4, [r0, #0]        @ shift >= 15, no biases
    ldm r1!, {r6}
    lsls r5, r4, #17
    lsrs r5, r5, #17
    asrs r4, r4, #15
    muls r5, r6
    muls r4, r6
    asrs r5, r5, #15
    adds r4, r4, r5
    asrs r4, r7
    stm r0!, {r4}
    subs r3, #1
    bne 5b
    b 9f
7:  adds r7, #15           @ shift 0..14: r7 = shift, r8 = 15 - shift
    movs r5, #15
    subs r5, r5, r7
    mov r8, r5
8:  ldr r4, [r0, #0]
    ldm r1!, {r6}
    lsls r5, r4, #17
    lsrs r5, r5, #17
    asrs r4, r4, #15
    muls r5, r6
    muls r4, r6
    asrs r5, r7
    mov r6, r8
    lsls r4, r6
    adds r4, r4, r5
    cmp r2, #0
    beq 6f
    ldm r2!, {r6}
    adds r4, r4, r6
6:  stm r0!, {r4}
    subs r3, #1
    bne 8b
9:  pop {r4-r7}
    mov r8, r4
    mov r9, r5
    mov r10, r6
    mov r11, r7
