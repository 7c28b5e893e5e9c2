"""Cycles per int8 multiply-add of the Pico's matvec paths, and cycles per byte of reading weights from flash,
measured on the emulated Pico (real RPI_PICO MicroPython firmware in rp2040js, rp2040/pico_exec.py).

    .venv/bin/python benchmarks/bench_pico_kernels.py [--rows 224] [--cols 80] [--profile MODEL_DIR]

Paths: `matvec4` over 4-row interleaved weights (model.bin v4; rp2040/asm/matvec.S: the sums and the
requantization in one asm_thumb call), through the runtime's viper entry and called alone; `matvec` with
word-aligned row-major rows (asm_thumb dot products and requantization), the dot products alone (`dots`),
asm_thumb dot products with the viper requantization (a shift above 46 takes it), and rows at byte offset 1
with that shift (all viper: the path every row took before asm_thumb). Flash: `readinto` of a littlefs file
into a reused buffer, in 4 KiB blocks and in one read of the whole matrix, as the streaming runtime does per
layer. Cycles are emulated (125 per us of `time.ticks_us`), so the figures are the same on any host; rp2040js
does not model the XIP flash cache, so real flash reads cost more. The matvec4 times are of the call,
requantization included, less what reading the clock costs; the last line is the best of the runtime's
matvec entries (`matvec4`, `matvec`). `--profile` runs an exported model's forward pass on the board instead
and says where a token's time goes (each kernel timed through a wrapper, which adds a few us per call).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rp2040.pico_exec import CYCLES_PER_US, run_code  # noqa: E402
from utils.errors import CliParser, at_least, cli  # noqa: E402

DEVICE = """
import time
from array import array
from piconeox import matvec_native as KN
R, C = {rows}, {cols}
w = bytearray(R * C + 4)
f = open("/blob.bin", "rb")
f.readinto(w)
x = array("i", [((i * 7919) % 20001) - 10000 for i in range(C)])
p = array("i", [1 << 14] * R)
out = array("i", [0] * R)

def best(fn):
    t = 1 << 30
    for _ in range(3):
        a = time.ticks_us()
        fn()
        t = min(t, time.ticks_diff(time.ticks_us(), a))
    return t

def clocked(fn, *a):  # the call itself, in a function: what reading the clock costs is subtracted
    t = c = 1 << 30
    for _ in range(3):
        s = time.ticks_us()
        c = min(c, time.ticks_diff(time.ticks_us(), s))
        s = time.ticks_us()
        fn(*a)
        t = min(t, time.ticks_diff(time.ticks_us(), s))
    return t - c

from piconeox import matvec_asm as KA
job = array("i", [(R << 16) | C, 0, 0, 20])
import uctypes
job[1] = uctypes.addressof(p)
print("@@ matvec4 asm_thumb_interleaved", clocked(KN.matvec4, out, w, 0, x, R, C, p, 0, 20, -1), R * C)
print("@@ matvec4_alone asm_thumb_interleaved", clocked(KA.matvec4, out, w, x, job), R * C)
print("@@ matvec asm_thumb", best(lambda: KN.matvec(out, w, 0, x, R, C, p, 0, 20, -1)), R * C)
print("@@ dots asm_thumb", best(lambda: KN.dots(out, w, x, (R << 16) | C)), R * C)
print("@@ matvec viper_requantize", best(lambda: KN.matvec(out, w, 0, x, R, C, p, 0, 47, -1)), R * C)
print("@@ matvec viper", best(lambda: KN.matvec(out, w, 1, x, R, C, p, 0, 47, -1)), R * C)
mv = memoryview(w)
def blocks():
    f.seek(0)
    for i in range(0, R * C - 4095, 4096):
        f.readinto(mv[i:i + 4096])
print("@@ read 4KiB_blocks", best(blocks), (R * C) // 4096 * 4096)
def whole():
    f.seek(0)
    f.readinto(mv[:R * C])
print("@@ read whole_matrix", best(whole), R * C)
"""

PROFILE = """
import time
from piconeox import gpt
from piconeox.generate import load
model = load("/model")[0]
M4 = gpt.IK.matvec4
t = time.ticks_us()
for pos in range(POSITIONS):
    logits = model.forward(pos % 200 + 32, pos)  # assigned: the REPL would print it
print("@@ unwrapped", time.ticks_diff(time.ticks_us(), t) // POSITIONS)
T = {}
def timed(name, fn):
    T[name] = 0
    def run(*a):
        t = time.ticks_us()
        r = fn(*a)
        T[name] += time.ticks_diff(time.ticks_us(), t)
        return r
    return run
for name in ("matvec", "attend", "layernorm", "quantize", "gelu", "rotate", "store16"):
    setattr(gpt.IK, name, timed(name, getattr(gpt.IK, name)))
model._fetch = timed("read weights" if model.stream else "address weights", model._fetch)
for name in ("embed", "residual", "matvec4"):
    setattr(gpt.IK, name, timed(name, getattr(gpt.IK, name)))
model.kernel = {k: gpt.IK.matvec4 if v is M4 else gpt.IK.matvec for k, v in model.kernel.items()}
t = time.ticks_us()
for pos in range(POSITIONS):
    logits = model.forward(pos % 200 + 32, pos)  # assigned: the REPL would print it
total = time.ticks_diff(time.ticks_us(), t)
for k in T:
    print("@@", k.replace(" ", "_"), T[k] // POSITIONS)
print("@@ python_glue", (total - sum(T.values())) // POSITIONS)
print("@@ forward", total // POSITIONS)
"""


def profile(model_dir: Path, positions: int) -> None:
    from rp2040.bundle import model_files
    from rp2040.emulate import in_place

    files = model_files(model_dir)
    raw = files.pop("/model/model.bin") if in_place(model_dir) else None  # where rp2040.flash puts it
    out = run_code(PROFILE.replace("POSITIONS", str(positions)), files, raw=raw)
    print(f"emulated Pico, 125 MHz, {model_dir}: forward pass at positions 0..{positions - 1}, per token\n")
    rows = [line[3:].split() for line in out.splitlines() if line.startswith("@@ ") and line != "@@ DONE"]
    print(f"forward pass without the timing wrappers: {int(rows[0][1]):,} us\n")
    print("| part (wrapped run) | us | share |\n|---|---|---|")
    total = int(rows[-1][1])
    for name, us in rows[1:]:
        print(f"| {name.replace('_', ' ')} | {int(us):,} | {100 * int(us) / total:.0f}% |")


@cli
def main(argv=None) -> int:
    ap = CliParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=at_least(4), default=224,
                    help="matrix rows, a multiple of 4 (default 224: pico-large's FFN)")
    ap.add_argument("--cols", type=at_least(8), default=80, help="matrix columns, a multiple of 8 (default 80)")
    ap.add_argument("--profile", type=Path, help="an exported int8 model: where its forward pass spends time")
    ap.add_argument("--positions", type=at_least(1), default=8, help="--profile: positions run (default 8)")
    args = ap.parse_args(argv)
    if args.cols % 8 or args.rows % 4:
        ap.error(f"--rows {args.rows} x --cols {args.cols}: give rows a multiple of 4 and columns a multiple of 8 "
                 "(the interleaved kernel's blocks)")
    if args.profile:
        profile(args.profile, args.positions)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        blob = Path(tmp) / "blob.bin"
        blob.write_bytes(bytes((i * 37 + 11) & 255 for i in range(args.rows * args.cols + 4)))
        out = run_code(DEVICE.format(rows=args.rows, cols=args.cols), {"/blob.bin": blob})
    print(f"emulated Pico, 125 MHz, {args.rows}x{args.cols} int8 matrix\n")
    print("| what | path | us | cycles per multiply-add (or byte) |\n|---|---|---|---|")
    matvecs = []
    for line in out.splitlines():
        if line.startswith("@@ ") and line != "@@ DONE":
            what, path, us, n = line[3:].split()
            if int(n) == 0:  # a matrix under 4 KiB has no whole 4 KiB block to read
                continue
            cycles = int(us) * CYCLES_PER_US / int(n)
            print(f"| {what} | {path} | {us} | {cycles:.2f} |")
            if what in ("matvec", "matvec4"):  # the runtime's entries, requantization and call included
                matvecs.append(cycles)
    print(f"\nbest matvec: {min(matvecs):.2f} cycles per multiply-add")
    return 0


if __name__ == "__main__":
    sys.exit(main())
