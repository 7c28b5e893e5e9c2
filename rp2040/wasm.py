"""Run the runtime inside real MicroPython (the pinned WebAssembly port, under node) from Python.

Used by the tests and benchmarks/bench_rp2040.py. `unavailable()` says why it cannot run (no node,
or `npm install` not done in rp2040/), so callers can skip with that reason.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rp2040.bundle import compile_runtime, model_files, runtime_files
from utils.errors import PiconeoxError

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "harness.mjs"
PACKAGE = HERE / "node_modules" / "@micropython" / "micropython-webassembly-pyscript"


@dataclass
class CallResult:
    """One runPython call: what it printed and its memory (see harness.mjs)."""

    stdout: str
    live_bytes: int  # heap in use when the call started (previous garbage collected)
    alloc_bytes: int  # bytes allocated during the call
    ms: float


def unavailable() -> str | None:
    """Why MicroPython cannot run here, or None when it can."""
    if shutil.which("node") is None:
        return "node is not installed (needed to run MicroPython WebAssembly): install Node.js 18+ (https://nodejs.org/)"
    if not (PACKAGE / "micropython.mjs").is_file():
        return "MicroPython WebAssembly not installed: run ./setup.sh --dev (npm install in rp2040/)"
    return None


def run(calls: list[str], model_dir: Path | None = None, mpy: bool = False,
        heapsize: int = 512 * 1024, timeout: float = 600) -> list[CallResult]:
    """Run `calls` (Python source, one runPython each) with the runtime at /lib/piconeox and the model at /model."""
    reason = unavailable()
    if reason:
        raise PiconeoxError(reason)
    with tempfile.TemporaryDirectory() as tmp:
        files = runtime_files()
        if mpy:
            files = compile_runtime(files, Path(tmp), march=None)
        if model_dir is not None:
            files.update(model_files(model_dir))
        job = {"heapsize": heapsize, "files": [[d, str(h)] for d, h in files.items()], "calls": calls}
        proc = subprocess.run(["node", str(HARNESS)], input=json.dumps(job), capture_output=True,
                              text=True, timeout=timeout, cwd=HERE)
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise PiconeoxError(f"MicroPython harness failed: {proc.stderr.strip()[-500:]}") from None
    if "error" in result:
        raise PiconeoxError(f"MicroPython call {result['call']} failed: {result['error']}")
    return [CallResult(c["stdout"], c["live"], c["alloc"], c["ms"]) for c in result["calls"]]
