"""The int8 linear over 4-row interleaved weights (model.bin v4: quantize + matvec4, as IntGPT runs it) against the
integer reference: on the emulated Pico (the asm_thumb of rp2040/asm/matvec.S, viper for shifts outside 0..46) and
in the WebAssembly MicroPython (the plain-Python twin)."""
import json

import numpy as np
import pytest

from rp2040 import emulate, wasm
from rp2040.model_bin import interleave
from rp2040.reference_ops import linear
from rp2040.runtime.fixed import input_limit

# (n_out, n_in, |x| below, |m| below, shift, bias): shifts >= 15, 0..14 (both asm) and negative (viper); no bias.
CASES = [(24, 40, 1 << 24, 32768, 30, True), (8, 16, 1 << 24, 32768, 20, False), (12, 8, 1 << 8, 64, 6, True),
         (4, 24, 1 << 10, 32, -3, True)]


def _cases():
    rng = np.random.default_rng(0)
    out = []
    for n_out, n_in, x_max, m_max, shift, biased in CASES:
        w = rng.integers(-127, 128, (n_out, n_in))
        w[:4, 0] = [-127, 127, -1, 0]  # every byte lane at the extremes
        x = rng.integers(-x_max, x_max, n_in)  # 2**24 is above the input limit: quantize shifts it
        mult = rng.integers(-m_max + 1, m_max, n_out)
        bias = rng.integers(-(1 << 20), 1 << 20, n_out) if biased else None
        out.append((n_out, n_in, w, x, mult, bias, shift))
    return out


def _device_code(cases) -> str:
    lines = ["from array import array", "from piconeox import intkernels as IK"]
    for n_out, n_in, w, x, mult, bias, shift in cases:
        blocks = np.frombuffer(interleave(w.astype(np.int8)), np.int8)
        p = mult.tolist() + ([] if bias is None else bias.tolist())
        lines += [f"w = array('b', {[0] * 4 + blocks.tolist()})",  # at offset 4: the runtime passes offsets
                  f"x = array('i', {x.tolist()})", f"p = array('i', {p})",
                  f"xq = array('i', [0] * {n_in})", f"out = array('i', [0] * {n_out})",
                  f"s = IK.quantize(xq, 0, x, 0, {n_in}, {input_limit(n_in)})",
                  f"IK.matvec4(out, w, 4, xq, {n_out}, {n_in}, p, 0, {shift} - s, {-1 if bias is None else n_out})",
                  "print('@@', list(out))"]
    return "\n".join(lines)


def _results(stdout: str) -> list[list[int]]:
    return [json.loads(line[3:]) for line in stdout.splitlines() if line.startswith("@@ [")]


def _expected(cases) -> list[list[int]]:
    return [linear(x[None], w, mult, shift, bias)[0].tolist() for _, _, w, x, mult, bias, shift in cases]


@pytest.mark.skipif(emulate.unavailable() is not None, reason=str(emulate.unavailable()))
def test_interleaved_asm_thumb_kernel_on_the_emulated_pico_equals_the_reference():
    from rp2040.pico_exec import run_code

    cases = _cases()
    assert _results(run_code(_device_code(cases), max_wall_s=120)) == _expected(cases)


@pytest.mark.skipif(wasm.unavailable() is not None, reason=str(wasm.unavailable()))
def test_interleaved_plain_python_kernel_in_micropython_equals_the_reference():
    cases = _cases()
    assert _results(wasm.run([_device_code(cases)])[0].stdout) == _expected(cases)


def test_interleave_puts_the_four_rows_of_a_column_in_one_word():
    w = np.arange(-16, 16, dtype=np.int8).reshape(4, 8)
    words = np.frombuffer(interleave(w), "<u4")
    assert [(int(words[i]) >> (8 * r) & 255) - 128 for i in range(8) for r in range(4)] == w.T.ravel().tolist()
