"""The int8 linear kernel (quantize + matvec, as IntGPT._linear runs it) against the integer reference: on the
emulated Pico, where word-aligned rows go through the asm_thumb dot product and the others through viper, and in
the WebAssembly MicroPython, which runs the plain-Python twin."""
import json

import numpy as np
import pytest

from rp2040 import emulate, wasm
from rp2040.reference_ops import linear
from rp2040.runtime.fixed import input_limit

# (n_out, n_in, w_off, |x| below, |m| below, shift): word-aligned rows (asm_thumb dot products on the Pico), rows of
# 30 and rows starting at byte 1 (viper); requantization shifts >= 15 and 0..14 (asm_thumb) and negative (viper).
CASES = [(24, 36, 0, 1 << 24, 32768, 30), (5, 30, 0, 1 << 24, 32768, 20), (7, 12, 1, 1 << 10, 32, -3)]


def _cases():
    rng = np.random.default_rng(0)
    out = []
    for n_out, n_in, w_off, x_max, m_max, shift in CASES:
        w = rng.integers(-128, 128, (n_out, n_in))
        w[0, :4] = [-128, 127, -127, -1]  # every byte lane at the extremes of the sign extension
        x = rng.integers(-x_max, x_max, n_in)  # 2**24 is above the input limit: quantize shifts it
        mult = rng.integers(-m_max + 1, m_max, n_out)
        bias = rng.integers(-(1 << 20), 1 << 20, n_out)
        out.append((n_out, n_in, w_off, w, x, mult, bias, shift))
    return out


def _device_code(cases) -> str:
    lines = ["from array import array", "from piconeox import intkernels as IK"]
    for n_out, n_in, w_off, w, x, mult, bias, shift in cases:
        lines += [f"w = array('b', {[0] * w_off + w.flatten().tolist()})",
                  f"x = array('i', {x.tolist()})", f"p = array('i', {mult.tolist() + bias.tolist()})",
                  f"xq = array('i', [0] * {n_in})", f"out = array('i', [0] * {n_out})",
                  f"s = IK.quantize(xq, 0, x, 0, {n_in}, {input_limit(n_in)})",
                  f"IK.matvec(out, w, {w_off}, xq, {n_out}, {n_in}, p, 0, {shift} - s, {n_out})",
                  "print('@@', list(out))"]
    return "\n".join(lines)


def _results(stdout: str) -> list[list[int]]:
    return [json.loads(line[3:]) for line in stdout.splitlines() if line.startswith("@@ [")]


def _expected(cases) -> list[list[int]]:
    return [linear(x[None], w, mult, shift, bias)[0].tolist() for _, _, _, w, x, mult, bias, shift in cases]


@pytest.mark.skipif(emulate.unavailable() is not None, reason=str(emulate.unavailable()))
def test_asm_thumb_and_viper_kernels_on_the_emulated_pico_equal_the_reference():
    from rp2040.pico_exec import run_code

    cases = _cases()
    assert _results(run_code(_device_code(cases), max_wall_s=120)) == _expected(cases)


@pytest.mark.skipif(wasm.unavailable() is not None, reason=str(wasm.unavailable()))
def test_plain_python_kernel_in_micropython_equals_the_reference():
    cases = _cases()
    assert _results(wasm.run([_device_code(cases)])[0].stdout) == _expected(cases)
