"""Run a Python snippet on the emulated Pico with the runtime flashed (compiled for armv6m, as
`rp2040.flash --mpy` copies it) and return what it printed: kernel tests and cycle benchmarks.

The board boots the real RPI_PICO firmware in rp2040js (rp2040/emulate.py) with no main.py, the snippet
is pasted at its REPL, and the run ends when a line "@@ DONE" is printed (this module appends it).
`time.ticks_us()` on the board reads emulated time: 1 us = 125 cycles.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from rp2040 import emulate
from rp2040.bundle import compile_runtime, runtime_files
from utils.errors import PiconeoxError

CYCLES_PER_US = 125


def run_code(code: str, files: dict[str, Path] | None = None, max_wall_s: float = 600,
             raw: Path | None = None) -> str:
    """Console output of `code` run at the board's REPL; `files` (device path -> host file) are flashed
    beside the runtime, and `raw` (a model.bin read in place) into the raw flash region. Raises
    PiconeoxError with the console's tail if it stops without "@@ DONE"."""
    if emulate.unavailable():
        raise PiconeoxError(emulate.unavailable())
    firmware, bootrom = emulate.find_firmware(None, None)
    with tempfile.TemporaryDirectory() as tmp:
        flashed = compile_runtime(runtime_files(), Path(tmp), march="armv6m")
        del flashed["/main.py"]  # boot to the REPL
        image = Path(tmp) / "fs.img"
        image.write_bytes(emulate.filesystem_image({**flashed, **(files or {})}))
        paste = "\x05" + code.replace("\r", "") + "\nprint('@@ DONE')\n\x04"
        job = {"firmware": str(firmware), "bootrom": str(bootrom), "fs": str(image), "max_wall_s": max_wall_s,
               "steps": [{"wait": "", "send": "\x03\x03"}, {"wait": ">>> $", "send": paste}],
               "raw": str(raw) if raw else None, "raw_offset": emulate.RAW_OFFSET,
               "done": r"(^|\n)@@ DONE\r?\n", "boot_s": emulate.BOOT_S, "boot_wall_s": emulate.BOOT_WALL_S}
        proc = subprocess.run(["node", str(emulate.RUNNER)], input=json.dumps(job), capture_output=True,
                              text=True, errors="replace", cwd=emulate.HERE, timeout=max_wall_s + 60)
    try:
        status = json.loads(proc.stderr.strip().splitlines()[-1])["status"]
    except (IndexError, json.JSONDecodeError):
        status = "emulator failed: " + proc.stderr.strip()[-300:]
    if status != "ok":
        raise PiconeoxError(f"emulated Pico stopped ({status}): {proc.stdout[-600:]}")
    return proc.stdout
