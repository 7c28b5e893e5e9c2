"""Copy the runtime and an exported model to a Raspberry Pi Pico with mpremote, then start it.

    python -m rp2040.flash models/<name> [--port auto|/dev/ttyACM0] [--mpy] [--prompt TEXT] [--dry-run]

Board layout: /main.py, /lib/piconeox/*.py|.mpy, /model/{model.bin, vocab.bin, config.json} and,
with --prompt, /prompt.txt (main.py then generates from it instead of asking at the REPL).
--mpy precompiles the runtime with `mpy-cross -march=armv6m` (native code: the viper kernel runs).
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rp2040.bundle import DEVICE_MODEL_DIR, DEVICE_PACKAGE, check_model, compile_runtime, model_files, runtime_files
from rp2040.prompt import check_prompt, model_config
from utils.atomic import atomic_write
from utils.errors import CliParser, PiconeoxError, cli

RP2040_USB_VID = 0x2E8A  # Raspberry Pi: the Pico's MicroPython USB serial
FREE_FLASH_CMD = "import os; s = os.statvfs('/'); print(s[0] * s[3])"


@dataclass
class Step:
    """One mpremote invocation of the plan."""

    what: str
    argv: list[str]

    def __str__(self) -> str:
        return f"# {self.what}\n{shlex.join(self.argv)}"


def find_mpremote(search_path: str | None = None) -> str:
    """The mpremote executable on PATH or beside this Python; one clear line when absent."""
    found = shutil.which("mpremote", path=search_path)
    if found is None and search_path is None:
        found = shutil.which("mpremote", path=str(Path(sys.executable).parent))
    if found is None:
        raise PiconeoxError("mpremote not found: install it with `pip install -r requirements.txt` "
                            "(mpremote is pinned there)")
    return found


def find_port() -> str:
    """The serial port of the first Raspberry Pi USB device; one clear line when there is none."""
    from serial.tools import list_ports  # pyserial comes with mpremote

    ports = sorted(p.device for p in list_ports.comports() if p.vid == RP2040_USB_VID)
    if not ports:
        raise PiconeoxError("no board found: connect a Pico running MicroPython over USB, or pass --port /dev/ttyACM0")
    return ports[0]


def check_fits(files: dict[str, Path], free_bytes: int) -> None:
    """Refuse in one line, naming the largest file, when the files do not fit the board's free flash."""
    sizes = {host: host.stat().st_size for host in files.values()}
    total = sum(sizes.values())
    if total > free_bytes:
        largest = max(sizes, key=sizes.get)
        raise PiconeoxError(f"{len(files)} files need {total:,} bytes but the board has {free_bytes:,} bytes of free "
                            f"flash (largest: {largest.name}, {sizes[largest]:,} bytes); use --mpy or a smaller model")


def plan(mpremote: str, port: str, files: dict[str, Path], start: bool) -> list[Step]:
    """The mpremote commands that copy `files` (device path -> host path) and start main.py."""
    base = [mpremote, "connect", port]
    dirs = sorted({d.rsplit("/", 1)[0] for d in files if d.count("/") > 1})
    steps = [Step("make directories " + ", ".join(_parents(dirs)), base + ["exec", _mkdirs(_parents(dirs))])]
    for dev, host in files.items():
        steps.append(Step(f"copy {host.name} ({host.stat().st_size:,} bytes)",
                          base + ["fs", "cp", str(host), ":" + dev]))
    if start:
        steps.append(Step("run main.py and stream its output", base + ["exec", "import main"]))
    else:
        steps.append(Step("reset: main.py starts and asks for a prompt (attach with `mpremote repl`)",
                          base + ["reset"]))
    return steps


def _parents(dirs: list[str]) -> list[str]:
    out: list[str] = []
    for d in dirs:
        parts = d.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            p = "/" + "/".join(parts[:i])
            if p not in out:
                out.append(p)
    return out


def _mkdirs(dirs: list[str]) -> str:
    """One line of MicroPython that creates the missing ones of `dirs` (parents listed first)."""
    names = ", ".join(f'"{d}"' for d in dirs)
    return (f"import os; [os.mkdir(d) for d in ({names},) "
            'if d.rsplit("/", 1)[1] not in os.listdir(d.rsplit("/", 1)[0] or "/")]')


def board_files(model_dir: Path, mpy: bool, build_dir: Path, prompt: str | None) -> dict[str, Path]:
    """Device path -> host path of everything to copy."""
    files = model_files(model_dir)  # first: refuses a model dir without its files before any work
    check_model(files[f"{DEVICE_MODEL_DIR}/model.bin"])  # truncated, foreign or corrupt: refused here, not on the board
    config = model_config(model_dir)  # a config.json the board could not parse: named here
    if prompt is not None:
        check_prompt(config, prompt)
    runtime = runtime_files()
    files = {**(compile_runtime(runtime, build_dir, march="armv6m") if mpy else runtime), **files}
    if prompt is not None:
        with atomic_write(build_dir / "prompt.txt", "w") as f:
            f.write(prompt)
        files["/prompt.txt"] = build_dir / "prompt.txt"
    return files


@cli
def main(argv: list[str] | None = None) -> int:
    ap = CliParser(prog="python -m rp2040.flash", description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="an exported model, e.g. models/<name>")
    ap.add_argument("--port", default="auto", help="serial port, or auto (first Raspberry Pi USB device)")
    ap.add_argument("--mpy", action="store_true", help="precompile the runtime with mpy-cross -march=armv6m")
    ap.add_argument("--prompt", help="generate from this prompt now (written to /prompt.txt)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, touch no board")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        files = board_files(args.model_dir, args.mpy, Path(tmp), args.prompt)
        mpremote = find_mpremote()
        port = args.port if args.port != "auto" or args.dry_run else find_port()
        steps = plan(mpremote, port, files, start=args.prompt is not None)
        if args.dry_run:
            # The build folder is deleted on exit: name it <build> rather than print a dead path.
            print(f"plan for {args.model_dir} -> {port} ({len(files)} files, "
                  f"{sum(p.stat().st_size for p in files.values()):,} bytes; runtime at {DEVICE_PACKAGE}, "
                  f"model at {DEVICE_MODEL_DIR}; <build> = a temporary folder for compiled .mpy and prompt.txt):")
            print("\n".join(str(s) for s in steps).replace(tmp, "<build>"))
            return 0
        free = subprocess.run([mpremote, "connect", port, "exec", FREE_FLASH_CMD], capture_output=True, text=True)
        if free.returncode != 0:
            raise PiconeoxError(f"cannot talk to the board on {port}: {(free.stderr or free.stdout).strip()[-200:]}")
        check_fits(files, int(free.stdout.strip().splitlines()[-1]))
        for step in steps:
            print(f"==> {step.what}", flush=True)
            if subprocess.run(step.argv).returncode != 0:
                raise PiconeoxError(f"mpremote failed at: {step.what} (command: {shlex.join(step.argv)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
