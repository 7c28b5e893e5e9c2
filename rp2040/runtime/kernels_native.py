"""Viper version of the int8 inner loop, for ports with native emitters (the RP2040's).

Imported under try/except by kernels.py: CPython has no `micropython` module and the WebAssembly
port rejects viper at compile time; both keep the plain-Python loop, which computes the same ints.
"""
import micropython


@micropython.viper
def rows_dot_i8(acc, w, w_off: int, xq, n_out: int, n_in: int):
    pa = ptr32(acc)  # noqa: F821  (viper builtins)
    pw = ptr8(w)  # noqa: F821
    px = ptr32(xq)  # noqa: F821
    k = w_off
    for o in range(n_out):
        s = 0
        for i in range(n_in):
            v = pw[k + i]
            if v > 127:  # ptr8 reads unsigned; the weights are two's-complement int8
                v -= 256
            s += v * px[i]
        pa[o] = s
        k += n_in
