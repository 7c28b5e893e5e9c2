"""Run an exported model on an emulated Raspberry Pi Pico: real MicroPython firmware in rp2040js.

    python -m rp2040.emulate models/<name> [--prompt TEXT] [--tokens 16] [--firmware UF2] [--bootrom BIN]

The flash holds exactly what `python -m rp2040.flash --mpy` copies (littlefs at the RPI_PICO offset).
The board boots, main.py starts, and the generation is typed into its REPL (rp2040/device_probe.py).
Prints the text, emulated tokens/s at 125 MHz (deterministic: emulated cycles, not wall time), the
heap free after loading and its minimum during generation, and whether the ids equal the host's.
Emulation costs ~10 s of wall time per emulated second.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rp2040.bundle import DEVICE_MODEL_DIR, check_model, model_files
from rp2040.estimate import ESTIMATE_CYCLES_PER_BYTE, flash_bytes_per_token, real_board_tok_per_s
from rp2040.flash import board_files
from rp2040.prompt import check_prompt, context_stop, host_ids, model_config
from rp2040.runtime.xip import RAW_OFFSET
from rp2040.uf2 import FLASH_SIZE, check_uf2
from utils.errors import CliParser, PiconeoxError, cli
from utils.textfile import printable

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "emulator.mjs"
SHARED_PICO = HERE.parent.parent / "shared" / "pico"  # ../shared/pico beside the checkout
FIRMWARE_GLOB = "micropython-*rpi_pico*.uf2"
BOOTROM = "bootrom-b1.bin"
# RPI_PICO's littlefs2: the last 1408 KiB of the 2 MiB flash, 4096-byte blocks, mounted by MicroPython
# with read/prog/lookahead size 32.
FS_BLOCK_SIZE, FS_BLOCKS, FS_IO_SIZE = 4096, 352, 32
HEAP_BYTES = 245_888  # MicroPython v1.28 RPI_PICO GC heap
DEFAULT_PROMPT = "Once upon a time"
DEFAULT_TOKENS = 16
# The firmware must answer at its REPL by then (MicroPython v1.28 RPI_PICO does 0.017 emulated seconds after
# reset): a UF2 that boots nothing stops here instead of at the wall-clock limit. The wall-clock deadline
# covers a board whose clock stops (asleep with no timer set).
BOOT_S, BOOT_WALL_S = 2.0, 120.0


@dataclass
class Emulation:
    """What one emulated generation measured (times in emulated microseconds)."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    step_us: list[int] = field(default_factory=list)
    sample_us: list[int] = field(default_factory=list)
    heap_imported: int = 0
    heap_loaded: int = 0
    heap_min: int = 0
    prompt_us: int = 0
    stream: bool = False
    emulated_s: float = 0.0
    wall_s: float = 0.0

    @property
    def tok_per_s(self) -> float:
        return len(self.step_us) * 1e6 / sum(self.step_us) if self.step_us else 0.0

    @property
    def step_ms(self) -> float:
        return sum(self.step_us) / len(self.step_us) / 1000 if self.step_us else 0.0

    @property
    def sample_ms(self) -> float:
        return sum(self.sample_us) / len(self.sample_us) / 1000 if self.sample_us else 0.0


def tools_missing() -> str | None:
    """Why the emulator cannot run here (no node, npm packages or littlefs-python), or None."""
    if shutil.which("node") is None:
        return "node is not installed (needed to run the rp2040js emulator): install Node.js 18+ (https://nodejs.org/)"
    if not (HERE / "node_modules" / "rp2040js").is_dir():
        return "rp2040js not installed: run ./setup.sh --dev (npm install in rp2040/)"
    try:
        import littlefs  # noqa: F401
    except ImportError:
        return "littlefs-python not installed: run ./setup.sh --dev"
    return None


def unavailable() -> str | None:
    """tools_missing(), or the missing firmware's line (the tests skip with it), or None."""
    if tools_missing():
        return tools_missing()
    try:
        find_firmware(None, None)
    except PiconeoxError as e:
        return str(e)
    return None


def find_firmware(firmware: Path | None, bootrom: Path | None) -> tuple[Path, Path]:
    """(firmware .uf2, boot ROM): the given paths, else ../shared/pico's; one clear line when missing."""
    if firmware is None:
        found = sorted(SHARED_PICO.glob(FIRMWARE_GLOB))
        if not found:
            raise PiconeoxError(f"no RPI_PICO firmware in {SHARED_PICO}: download the Raspberry Pi Pico .uf2 "
                                "from https://micropython.org/download/RPI_PICO/ and pass --firmware PATH")
        firmware = found[-1]
    elif not Path(firmware).is_file():
        what = "is a folder" if Path(firmware).is_dir() else "does not exist"
        raise PiconeoxError(f"--firmware {firmware} {what}; give a RPI_PICO MicroPython .uf2 "
                            "(https://micropython.org/download/RPI_PICO/)")
    elif Path(firmware).suffix != ".bin":  # a raw flash image (.bin) has no header to check: the boot deadline
        check_uf2(Path(firmware))
    elif Path(firmware).stat().st_size > FLASH_SIZE:
        raise PiconeoxError(f"--firmware {firmware} ({Path(firmware).stat().st_size:,} bytes) does not fit the Pico's "
                            f"{FLASH_SIZE >> 20} MiB of flash; give a RPI_PICO MicroPython .uf2")
    if bootrom is None:
        candidates = [Path(firmware).parent / BOOTROM, SHARED_PICO / BOOTROM]
        bootrom = next((c for c in candidates if c.is_file()), None)
        if bootrom is None:
            raise PiconeoxError(f"no RP2040 boot ROM ({BOOTROM}) beside the firmware or in {SHARED_PICO}: take the B1 "
                                "build of https://github.com/raspberrypi/pico-bootrom (the rp2040js demo ships it), "
                                "pass --bootrom")
    elif not Path(bootrom).is_file() or Path(bootrom).stat().st_size != 16384:
        raise PiconeoxError(f"--bootrom {bootrom} is not a 16,384-byte RP2040 boot ROM image")
    return Path(firmware), Path(bootrom)


def filesystem_image(files: dict[str, Path]) -> bytes:
    """The littlefs2 image MicroPython's RPI_PICO build mounts, holding `files` (device path -> host file)."""
    from littlefs import LittleFS

    fs = LittleFS(block_size=FS_BLOCK_SIZE, block_count=FS_BLOCKS, read_size=FS_IO_SIZE,
                  prog_size=FS_IO_SIZE, lookahead_size=FS_IO_SIZE, disk_version=0x00020001)
    made = set()
    for dev, host in files.items():
        parts = dev.strip("/").split("/")
        for i in range(1, len(parts)):
            d = "/" + "/".join(parts[:i])
            if d not in made:
                fs.mkdir(d)
                made.add(d)
        with fs.open(dev, "wb") as f:
            f.write(host.read_bytes())
    return bytes(fs.context.buffer)


def _steps(prompt: str, tokens: int) -> list[dict]:
    """REPL conversation: stop whatever runs, soft-reset so main.py boots with the console attached,
    interrupt it at its prompt, then paste the probe (Ctrl-E ... Ctrl-D)."""
    probe = f"ARGS = {json.dumps({'prompt': prompt, 'tokens': tokens})}\n" + (HERE / "device_probe.py").read_text()
    return [{"wait": "", "send": "\x03\x03"},
            {"wait": "(>>> |prompt> )$", "send": "\x03\x04"},
            {"wait": "prompt> $", "send": "\x03"},
            {"wait": ">>> $", "send": "\x05" + probe.replace("\r", "") + "\x04"}]


def emulate(model_dir: Path, prompt: str = DEFAULT_PROMPT, tokens: int = DEFAULT_TOKENS,
            firmware: Path | None = None, bootrom: Path | None = None, progress: bool = True,
            max_wall_s: float = 3600) -> Emulation:
    """Boot the firmware with the model flashed and generate `tokens` tokens; raises PiconeoxError with
    the device's one-line error (or the emulator's) on failure."""
    from tqdm import tqdm

    if tokens < 1:
        raise PiconeoxError(f"--tokens {tokens} must be >= 1")
    check_model(model_files(Path(model_dir))["/model/model.bin"])
    check_prompt(model_config(model_dir), prompt)  # on the host: the board would fail with a MemoryError
    firmware, bootrom = find_firmware(firmware, bootrom)
    if why := tools_missing():
        raise PiconeoxError(why)
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "fs.img"
        files, raw = flashed(Path(model_dir), Path(tmp))
        image.write_bytes(filesystem_image(files))
        job = {"firmware": str(firmware), "bootrom": str(bootrom), "fs": str(image), "steps": _steps(prompt, tokens),
               "raw": str(raw) if raw else None, "raw_offset": RAW_OFFSET, "done": r"(^|\n)@@ DONE\r?\n",
               "max_wall_s": max_wall_s, "boot_s": BOOT_S, "boot_wall_s": BOOT_WALL_S}
        proc = subprocess.Popen(["node", str(RUNNER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=HERE)
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
        result, error, console = None, None, []
        bar = tqdm(total=tokens, desc="emulated tokens", unit="tok", disable=not progress, leave=False)
        for raw in proc.stdout:
            line = raw.decode("latin1").rstrip("\r\n")
            console.append(line)
            if not line.startswith("@@ "):
                continue
            key, _, rest = line[3:].partition(" ")
            if key == "heap_imported":
                result = Emulation([], heap_imported=int(rest))
            elif key == "loaded":
                free, stream, _ = rest.split()
                result.heap_loaded = result.heap_min = int(free)
                result.stream = stream == "True"
            elif key == "prompt":
                result.prompt_ids = json.loads(rest)
            elif key == "prompt_us":
                result.prompt_us = int(rest)
            elif key == "tok":
                t, step, sample, free = map(int, rest.split())
                result.ids.append(t)
                result.step_us.append(step)
                result.sample_us.append(sample)
                result.heap_min = min(result.heap_min, free)
                bar.update(1)
            elif key == "error":
                error = rest.partition(" ")[2] or rest
        bar.close()
        stderr = proc.stderr.read().decode(errors="replace").strip()
        proc.wait()
    if error is not None:
        raise PiconeoxError(f"on the emulated Pico: {error}")
    try:
        summary = json.loads(stderr.splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise PiconeoxError(f"emulator failed: {node_error(stderr)}") from None
    if summary["status"] == "no_boot":
        raise PiconeoxError(f"the emulated Pico did not reach the MicroPython REPL within {BOOT_S:g} emulated "
                            f"seconds: is {firmware} a RPI_PICO MicroPython firmware? "
                            "(https://micropython.org/download/RPI_PICO/)")
    if summary["status"] != "ok" or result is None:
        tail = " | ".join(line for line in console[-6:] if line.strip())
        raise PiconeoxError(f"emulated Pico stopped ({summary['status']}): {tail[-300:]}")
    result.emulated_s, result.wall_s = summary["emu_ns"] / 1e9, summary["wall_s"]
    return result


def flashed(model_dir: Path, tmp: Path) -> tuple[dict[str, Path], Path | None]:
    """(littlefs files, model.bin for the raw flash region or None), as `rp2040.flash --mpy` installs them."""
    files = board_files(model_dir, True, tmp, None)
    return files, files.pop(f"{DEVICE_MODEL_DIR}/model.bin") if in_place(model_dir) else None


def in_place(model_dir: Path) -> bool:
    """Whether the export reads its weights in place from raw flash (config.json's runtime["xip"])."""
    return bool(model_config(model_dir)["runtime"].get("xip"))


def node_error(stderr: str) -> str:
    """The one line of a Node.js failure that says why (`RangeError: ...`), not its source excerpt and stack."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    found = next((line for line in lines if re.match(r"^[A-Za-z]*Error\b", line)), lines[-1] if lines else "no output")
    return printable(found)[:300]


@cli
def main(argv: list[str] | None = None) -> int:
    ap = CliParser(prog="python -m rp2040.emulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="an exported model, e.g. models/<name>")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"text to continue (default {DEFAULT_PROMPT!r})")
    ap.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help=f"tokens to generate (default {DEFAULT_TOKENS})")
    ap.add_argument("--firmware", type=Path, help=f"RPI_PICO MicroPython .uf2 (default: {SHARED_PICO}/{FIRMWARE_GLOB})")
    ap.add_argument("--bootrom", type=Path, help=f"RP2040 boot ROM (default: {BOOTROM} beside the firmware)")
    args = ap.parse_args(argv)
    run = emulate(args.model_dir, args.prompt, args.tokens, args.firmware, args.bootrom)
    from rp2040.runtime.tokenizer import StreamDecoder, Tokenizer

    tok = Tokenizer(str(args.model_dir / "vocab.bin"))
    dec = StreamDecoder(tok)
    config = model_config(args.model_dir)
    print(printable(args.prompt + "".join(dec.feed(t) for t in run.ids)))
    if note := context_stop(args.tokens, len(run.ids), len(run.prompt_ids), config["shape"]["context"]):
        print(note)
    same = host_ids(args.model_dir, run.prompt_ids, args.tokens) == run.ids
    print(f"{len(run.ids)} tokens at {run.tok_per_s:.2f} tok/s emulated (125 MHz): step {run.step_ms:.1f} ms = "
          f"forward {run.step_ms - run.sample_ms:.1f} + sampling {run.sample_ms:.1f}; "
          f"prompt ({len(run.prompt_ids)} tokens) {run.prompt_us / 1000:.0f} ms")
    predicted = config["ram"].get("free_after_load_bytes")
    where = ("weights read in place from raw flash" if in_place(args.model_dir) else
             "weights read in place from littlefs blocks" if model_config(args.model_dir)["runtime"].get("blocks")
             else "layers streamed from flash" if run.stream else "weights in RAM")
    print(f"heap: {run.heap_loaded:,} bytes free after load ({where}; "
          f"the exporter predicted {predicted:,}), {run.heap_min:,} minimum during generation (GC heap {HEAP_BYTES:,})")
    print(f"ids equal the host's: {'yes' if same else 'NO'}")
    read = flash_bytes_per_token(args.model_dir, config)
    print(f"estimate for a real RP2040 (not measured; XIP cache misses at {ESTIMATE_CYCLES_PER_BYTE} cycles per byte "
          f"of the {read:,} bytes of weights a token reads from flash, rp2040/estimate.py): "
          f"{real_board_tok_per_s(run.step_ms, read):.1f} tok/s")
    print(f"[{run.emulated_s:.1f} s emulated in {run.wall_s:.0f} s wall]")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
