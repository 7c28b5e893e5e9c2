"""An emulated Raspberry Pi Pico whose USB serial is a TCP port: flash it with rp2040.flash, or use mpremote.

    python -m rp2040.serve [--port 4444] [--firmware UF2] [--bootrom BIN]

The board starts as a new one does: MicroPython (../shared/pico's RPI_PICO firmware in rp2040js) and an
empty littlefs. Its serial port is socket://127.0.0.1:PORT, which mpremote and `rp2040.flash --port` take.
Type `reset` and Enter to press its reset button (the flash keeps what was written); Ctrl-C stops it.
Emulation costs ~10 s of wall time per emulated second: mpremote copies ~5 KB/s to it.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from rp2040.emulate import HERE, filesystem_image, find_firmware, tools_missing
from utils.errors import CliParser, PiconeoxError, cli

SERVER = HERE / "serve.mjs"


class EmulatedPico:
    """A running emulated board (a context manager). `files` (device path -> host file) are in its flash
    at power-on; none by default, as on a new board."""

    def __init__(self, files: dict[str, Path] | None = None, port: int = 0, firmware: Path | None = None,
                 bootrom: Path | None = None):
        self.files, self.port = files or {}, port
        self.firmware, self.bootrom = find_firmware(firmware, bootrom)
        if tools_missing():
            raise PiconeoxError(tools_missing())
        self.proc: subprocess.Popen | None = None
        self.resets = 0

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def __enter__(self) -> EmulatedPico:
        with tempfile.TemporaryDirectory() as tmp:
            image = Path(tmp) / "fs.img"
            image.write_bytes(filesystem_image(self.files))
            self.proc = subprocess.Popen(["node", str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, cwd=HERE)
            self._send(json.dumps({"firmware": str(self.firmware), "bootrom": str(self.bootrom),
                                   "fs": str(image), "port": self.port}))
            self.port = self._answer("port")  # the image is read by then
        return self

    def reset(self, after_bytes: int = 0) -> None:
        """Press the reset button (once the host has sent `after_bytes` more bytes, when given): the board
        reboots from its flash and the host's connection drops. Returns once it happened (or is armed)."""
        self._send(f"reset {after_bytes}")
        self.resets += 1
        if after_bytes:
            self._answer("armed")
        else:
            while self._answer("reset") < self.resets:
                pass

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.stdin.close()  # the server stops at the end of its input
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc.stderr.close()
            self.proc = None

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def _answer(self, key: str) -> int:
        """The server's next answer with `key` (those of an armed reset that fired meanwhile are passed over)."""
        while True:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                why = " ".join(self.proc.stderr.read().split())[-300:]
                raise PiconeoxError(f"the emulated Pico stopped: {why or 'no output'}")
            if key in json.loads(line):
                return json.loads(line)[key]


@cli
def main(argv: list[str] | None = None) -> int:
    ap = CliParser(prog="python -m rp2040.serve", description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=4444, help="TCP port on 127.0.0.1 (default 4444; 0: any free one)")
    ap.add_argument("--firmware", type=Path, help="RPI_PICO MicroPython .uf2 (default: ../shared/pico's)")
    ap.add_argument("--bootrom", type=Path, help="RP2040 boot ROM (default: bootrom-b1.bin beside the firmware)")
    args = ap.parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise PiconeoxError(f"--port {args.port} is not a TCP port (0-65535)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a service's stop: the board is shut down, exit 0
    with EmulatedPico(port=args.port, firmware=args.firmware, bootrom=args.bootrom) as pico:
        print(f"emulated Pico on {pico.url}: python -m rp2040.flash models/<name> --mpy --port {pico.url}\n"
              "type reset + Enter to reset it, Ctrl-C to stop", flush=True)
        for line in sys.stdin:
            if line.strip() == "reset":
                pico.reset()
                print("reset", flush=True)
        # no more input (nohup, a script, a service: stdin is /dev/null): the board serves on until a signal
        print("stdin closed: serving until Ctrl-C or SIGTERM (reset needs a terminal)", flush=True)
        pico.proc.wait()
        raise PiconeoxError(f"the emulated Pico stopped: {' '.join(pico.proc.stderr.read().split())[-300:]}")


if __name__ == "__main__":
    sys.exit(main())
