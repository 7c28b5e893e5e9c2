"""Copy the runtime and an exported model to a Raspberry Pi Pico with mpremote, then start it.

    python -m rp2040.flash models/<name> [--port auto|/dev/ttyACM0|socket://HOST:PORT] [--mpy] [--prompt TEXT]
                                         [--dry-run]

Board layout: /main.py, /lib/piconeox/*.py|.mpy, /model/{model.bin, vocab.bin, config.json} and,
with --prompt, /prompt.txt (main.py then generates from it instead of asking at the REPL).
--mpy precompiles the runtime with `mpy-cross -march=armv6m` (native code: the viper kernel runs).
Atomic: the files go to a staging folder, the board checks each one's size and sha256, and only then
swaps them in (rp2040/board_install.py); an interrupted flash leaves the previous install whole.
"""
from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rp2040.bundle import DEVICE_MODEL_DIR, DEVICE_PACKAGE, check_model, compile_runtime, model_files, runtime_files
from rp2040.prompt import check_prompt, model_config
from utils.atomic import atomic_write
from rp2040.blockfile import block_file
from rp2040.runtime.xip import RAW_END, RAW_OFFSET
from rp2040.uf2 import FLASH_SIZE
from utils.errors import CliParser, PiconeoxError, cli
from utils.textfile import printable, read_json

RP2040_USB_VID = 0x2E8A  # Raspberry Pi: the Pico's MicroPython USB serial
BOARD_SCRIPT = Path(__file__).resolve().parent / "board_install.py"
STAGE = "/.piconeox-new"  # board_install.py's STAGE
REPLACE = ["/main.py", "/prompt.txt", DEVICE_PACKAGE, DEVICE_MODEL_DIR]  # what a flash replaces; the model last
DIR_BLOCKS = 2  # a littlefs directory is a metadata pair
SPARE_BLOCKS = 4  # room for littlefs to rewrite metadata while it copies


@dataclass
class Step:
    """One mpremote invocation of the plan."""

    what: str
    argv: list[str]

    def __str__(self) -> str:
        return f"# {self.what}\n" + " \\\n  + ".join(shlex.join(c) for c in _split(self.argv, "+"))


def _split(argv: list[str], sep: str) -> list[list[str]]:
    out = [[]]
    for a in argv:
        out.append([]) if a == sep else out[-1].append(a)
    return out


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


def space_needed(files: dict[str, Path], block: int) -> int:
    """Bytes of flash the staged copy takes: whole blocks per file, two per directory, some spare."""
    dirs = {STAGE + "/".join(d.split("/")[:i]) for d in files for i in range(1, d.count("/") + 1)}
    blocks = sum(-(-host.stat().st_size // block) for host in files.values())
    return (blocks + DIR_BLOCKS * len(dirs) + SPARE_BLOCKS) * block


def check_fits(copy: dict[str, Path], files: dict[str, Path], free: int, block: int, old: int) -> bool:
    """Whether the current install must go first: `copy` (the files the board lacks) does not fit beside it,
    but all `files` fit in its room. One line when they never fit."""
    if space_needed(copy, block) <= free:
        return False
    need = space_needed(files, block)
    if need <= free + old:
        return True
    largest = max(files.values(), key=lambda p: p.stat().st_size)
    raise PiconeoxError(f"{len(files)} files need {need:,} bytes of flash but the board has {free + old:,} "
                        f"(free {free:,} + the current install {old:,}; largest file: {largest.name}, "
                        f"{largest.stat().st_size:,} bytes); use --mpy or a smaller model, or delete files on it")


def digests(files: dict[str, Path]) -> dict[str, list]:
    """Device path -> [size, sha256 hex] of each host file, as the board reports its own."""
    def sha256(path: Path) -> str:
        with open(path, "rb") as f:  # streamed: never a whole file in memory
            return hashlib.file_digest(f, "sha256").hexdigest()

    return {dev: [host.stat().st_size, sha256(host)] for dev, host in files.items()}


def board_script(build_dir: Path, name: str, args: dict) -> Path:
    """board_install.py with its ARGS, as a file for `mpremote run`."""
    path = Path(build_dir) / f"{name}.py"
    with atomic_write(path, "w") as f:
        f.write(f"ARGS = {args!r}\n" + BOARD_SCRIPT.read_text())
    return path


def probe_step(base: list[str], build_dir: Path) -> Step:
    script = board_script(build_dir, "probe", {"do": "probe", "replace": REPLACE})
    return Step("check the free flash and what the board has", base + ["run", str(script)])


def install_step(base: list[str], files: dict[str, Path], build_dir: Path, keep: set[str], clear: bool) -> Step:
    """Stage the files the board lacks (one `fs cp` per folder), check them on the board, swap them in with
    the unchanged ones (`keep`). Writes the board scripts into `build_dir`."""
    copy = {dev: host for dev, host in files.items() if dev not in keep}
    folders: dict[str, list[Path]] = {}
    for dev, host in copy.items():
        assert dev.rsplit("/", 1)[1] == host.name, (dev, host)  # `fs cp` into a folder keeps the name
        folders.setdefault(dev.rsplit("/", 1)[0], []).append(host)
    prepare = board_script(build_dir, "prepare", {"do": "prepare", "replace": REPLACE, "clear": clear,
                                                  "dirs": sorted(folders)})
    commit_args = {"do": "commit", "replace": REPLACE, "files": digests(copy), "keep": sorted(keep)}
    if raw := raw_model(files):  # model.bin goes to the raw flash region, read in place (runtime/xip.py)
        size, sha = digests({raw: files[raw]})[raw]
        commit_args["raw"] = {"path": raw, "size": size, "sha256": sha, "offset": RAW_OFFSET, "end": RAW_END}
    commit = board_script(build_dir, "commit", commit_args)
    argv = base + ["run", str(prepare)]
    for folder, hosts in folders.items():
        argv += ["+", "fs", "cp", "-f", *map(str, hosts), f":{STAGE}{folder}/"]
    size = sum(p.stat().st_size for p in copy.values())
    kept = f", keep {len(keep)} unchanged" if keep else ""
    raw_note = f", write {raw} into raw flash at {RAW_OFFSET:#x} and check it" if raw else ""
    return Step(f"copy {len(copy)} files ({size:,} bytes) to {STAGE}{kept}, check them on the board{raw_note}, "
                "swap them in", argv + ["+", "run", str(commit)])


def raw_model(files: dict[str, Path]) -> str | None:
    """The device path of model.bin when its export reads the weights in place from raw flash, else None."""
    config = files.get(f"{DEVICE_MODEL_DIR}/config.json")
    model = f"{DEVICE_MODEL_DIR}/model.bin"
    if config is None or model not in files:
        return None
    return model if read_json(config).get("runtime", {}).get("xip") else None


def start_step(base: list[str], start: bool) -> Step:
    if start:
        return Step("run main.py and stream its output", base + ["exec", "import main"])
    return Step("reset: main.py starts and asks for a prompt (attach with `mpremote repl`)", base + ["reset"])


def board_files(model_dir: Path, mpy: bool, build_dir: Path, prompt: str | None) -> dict[str, Path]:
    """Device path -> host path of everything to copy: the model first, main.py last."""
    files = model_files(model_dir)  # first: refuses a model dir without its files before any work
    if big := next((p for p in files.values() if p.stat().st_size > FLASH_SIZE), None):
        raise PiconeoxError(f"{big}: {big.stat().st_size:,} bytes, more than the Pico's {FLASH_SIZE >> 20} MiB of "
                            "flash: export a smaller model")
    check_model(files[f"{DEVICE_MODEL_DIR}/model.bin"])  # truncated, foreign or corrupt: refused here, not on the board
    config = model_config(model_dir)  # a config.json the board could not parse: named here
    if prompt is not None:
        check_prompt(config, prompt)
    if config.get("runtime", {}).get("blocks"):  # model.bin laid out over littlefs's blocks (rp2040/blockfile.py)
        model = files.pop(f"{DEVICE_MODEL_DIR}/model.bin")
        with atomic_write(build_dir / "model.blk", "wb") as f:
            f.write(block_file(model.read_bytes()))
        files = {f"{DEVICE_MODEL_DIR}/model.blk": build_dir / "model.blk", **files}
    runtime = runtime_files()
    files = {**files, **(compile_runtime(runtime, build_dir, march="armv6m") if mpy else runtime)}
    files["/main.py"] = files.pop("/main.py")
    if prompt is not None:
        with atomic_write(build_dir / "prompt.txt", "w") as f:
            f.write(prompt)
        files["/prompt.txt"] = build_dir / "prompt.txt"
    return files


def run_board(step: Step, failure: str) -> list[str]:
    """Run one mpremote step, passing its progress lines on; its "@@" lines back. On failure one line:
    `failure` with {why} filled in from the board's "@@ error" line or mpremote's last line."""
    proc = subprocess.run(step.argv, capture_output=True, text=True, errors="replace")
    lines = proc.stdout.splitlines()
    said = [line[3:] for line in lines if line.startswith("@@ ")]
    for line in lines:
        if line.startswith("cp "):
            print("  " + line.split()[1].rsplit("/", 1)[-1], flush=True)
    if proc.returncode != 0 or not said or said[-1] != "ok":
        why = next((s[6:] for s in said if s.startswith("error ")), None) or _why(proc)
        raise PiconeoxError(failure.format(why=printable(why)[:300]))  # escaped: the board's text
    return said


def _why(proc: subprocess.CompletedProcess) -> str:
    """mpremote's reason in one line: the first exception of a chained traceback (the cause; later ones can
    be mpremote's own slips while reporting it) without its module path, else its last line of output."""
    causes = [ln for ln in proc.stderr.splitlines()
              if ln.strip() and not ln.startswith((" ", "Traceback", "During handling"))]
    tail = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip() and not ln.startswith("cp ")]
    line = (causes[:1] or tail[-1:] or [f"mpremote exit code {proc.returncode}"])[0]
    name, colon, rest = line.partition(":")
    return ((name.rsplit(".", 1)[-1] if colon and " " not in name else name) + colon + rest)[-200:]


def probe_answer(said: list[str], port: str) -> tuple[dict, int, int, int]:
    """({device path: [size, sha256]} the board has, free bytes, block size, bytes of the current install) from the
    probe's "@@" lines; one line when the board answers what board_install.py never says."""
    try:
        have = {w[1]: [int(w[2]), w[3]] for w in (line.split() for line in said) if w and w[0] == "have"}
        free, block, old = map(int, said[-2].split()[1:])
        if not (free >= 0 and block > 0 and old >= 0):
            raise ValueError
    except (ValueError, IndexError):
        shown = printable(" | ".join(said))[:200]
        raise PiconeoxError(f"the board on {port} answered the probe with {shown!r}, not what piconeox's installer "
                            "says: is it a Pico running MicroPython?") from None
    return have, free, block, old


def flash(files: dict[str, Path], base: list[str], port: str, build_dir: Path, start: bool) -> None:
    """Probe the board, install `files` atomically, start main.py."""
    started = time.monotonic()
    said = run_board(probe_step(base, build_dir),
                     f"no MicroPython REPL answered on {port} ({{why}}): is it a Pico running MicroPython?")
    have, free, block, old = probe_answer(said, port)
    keep = {dev for dev, d in digests(files).items() if have.get(dev) == d}
    clear = check_fits({d: h for d, h in files.items() if d not in keep}, files, free, block, old)
    if clear:
        keep = set()
        print("note: the new files fit only in the room of the current install: removing it first "
              "(the board has no model until this flash completes)")
    step = install_step(base, files, build_dir, keep, clear)
    print(f"==> {step.what}", flush=True)
    kept = "the board has no model until a flash completes" if clear else "the board keeps its previous install"
    run_board(step, f"flashing {port} stopped ({{why}}): nothing was installed, {kept}; run the same command again")
    print(f"installed in {time.monotonic() - started:.1f} s", flush=True)
    step = start_step(base, start)
    print(f"==> {step.what}", flush=True)
    if subprocess.run(step.argv).returncode != 0:
        raise PiconeoxError(f"mpremote failed at: {step.what} (command: {shlex.join(step.argv)})")


@cli
def main(argv: list[str] | None = None) -> int:
    ap = CliParser(prog="python -m rp2040.flash", description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path, help="an exported model, e.g. models/<name>")
    ap.add_argument("--port", default="auto", help="serial port or pyserial URL (socket://127.0.0.1:PORT for "
                                                   "python -m rp2040.serve), or auto (first Raspberry Pi USB device)")
    ap.add_argument("--mpy", action="store_true", help="precompile the runtime with mpy-cross -march=armv6m")
    ap.add_argument("--prompt", help="generate from this prompt now (written to /prompt.txt)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, touch no board")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        files = board_files(args.model_dir, args.mpy, Path(tmp), args.prompt)
        port = args.port if args.port != "auto" or args.dry_run else find_port()
        base = [find_mpremote(), "connect", port]
        if args.dry_run:
            steps = [probe_step(base, Path(tmp)), install_step(base, files, Path(tmp), set(), False),
                     start_step(base, args.prompt is not None)]
            # The build folder is deleted on exit: name it <build> rather than print a dead path.
            print(f"plan for {args.model_dir} -> {port} ({len(files)} files; runtime at {DEVICE_PACKAGE}, model at "
                  f"{DEVICE_MODEL_DIR}; files the board has with the same sha256 are kept, not copied; <build> = "
                  f"a temporary folder for compiled .mpy, prompt.txt and the scripts from {BOARD_SCRIPT.name}):")
            print("\n".join(map(str, steps)).replace(tmp, "<build>"))
            return 0
        flash(files, base, port, Path(tmp), start=args.prompt is not None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
