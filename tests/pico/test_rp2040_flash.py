"""rp2040.flash without a board: the --dry-run plan, and one clear line for each failure (with the emulated
board: test_rp2040_flash_board.py)."""
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from configs.model import MODEL_PRESETS, build_model
from rp2040 import flash
from rp2040.export import export
from tests.support.paths import REPO
from utils.data.tokenizers import build_tokenizer, save_tokenizer
from utils.errors import PiconeoxError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("flash")
    build_model(MODEL_PRESETS["rp2040-speed"]).save_pretrained(d / "ckpt")
    save_tokenizer(build_tokenizer("byte", [], None), d / "ckpt" / "tokenizer.json")
    export(d / "ckpt", d / "speed", "int8")
    return d / "speed"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rp2040.flash", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO)


def _copies(stdout: str) -> dict[str, str]:
    """Device path -> host path of each file the plan's `fs cp` lines stage (one line per folder)."""
    out = {}
    for line in stdout.splitlines():
        if " fs cp -f " in line:
            *hosts, dest = line.split(" fs cp -f ", 1)[1].rstrip(" \\").split()
            assert dest.startswith(f":{flash.STAGE}/") and dest.endswith("/")
            out.update({dest[1 + len(flash.STAGE):] + Path(h).name: h for h in hosts})
    return out


def test_dry_run_prints_the_plan(model_dir):
    r = _cli(model_dir, "--port", "/dev/ttyACM0", "--dry-run", "--prompt", "Once upon a time")
    assert r.returncode == 0, r.stderr
    commands = [line for line in r.stdout.splitlines() if "mpremote" in line and not line.startswith("#")]
    assert len(commands) == 3 and all(" connect /dev/ttyACM0 " in c for c in commands)
    assert commands[0].endswith(" run <build>/probe.py")  # free flash and the board's files first
    assert commands[1].endswith(" run <build>/prepare.py \\")  # then stage, check and swap
    assert r.stdout.splitlines()[-3] == "  + run <build>/commit.py"
    copies = _copies(r.stdout)
    assert {"/main.py", "/lib/piconeox/gpt.py", "/lib/piconeox/kernels_native.py", "/model/model.bin",
            "/model/vocab.bin", "/model/config.json", "/prompt.txt"} <= set(copies)
    assert list(copies)[:3] == ["/model/model.bin", "/model/vocab.bin", "/model/config.json"]
    assert commands[-1].endswith("exec 'import main'")


def test_dry_run_mpy_copies_native_bytecode(model_dir):
    r = _cli(model_dir, "--dry-run", "--mpy", "--prompt", "Hi")
    assert r.returncode == 0, r.stderr
    copies = _copies(r.stdout)
    built = [h for d, h in copies.items() if d.startswith("/lib/")]
    assert built and all(p.startswith("<build>/") for p in built)  # not a temp path deleted on exit
    assert "/lib/piconeox/kernels_native.mpy" in copies and "/lib/piconeox/gpt.py" not in copies
    assert copies["/main.py"].endswith("rp2040/runtime/main.py")  # the board boots main.py from source
    assert "exec 'import main'" in r.stdout.splitlines()[-1]


def test_dry_run_without_prompt_resets_into_the_repl(model_dir):
    r = _cli(model_dir, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].endswith(" reset")  # no --prompt: reboot into the REPL prompt
    assert "/prompt.txt" not in _copies(r.stdout)


def test_truncated_model_bin_is_refused_in_one_line(model_dir, tmp_path):
    for name in ("vocab.bin", "config.json"):
        (tmp_path / name).write_bytes((model_dir / name).read_bytes())
    (tmp_path / "model.bin").write_bytes((model_dir / "model.bin").read_bytes()[:5000])
    r = _cli(tmp_path, "--dry-run")
    assert r.returncode == 2 and r.stderr.strip() == f"error: {tmp_path / 'model.bin'}: model.bin is truncated"


def test_no_board_is_one_clear_line(model_dir):
    r = _cli(model_dir)  # --port auto and this machine has no Pico
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: no board found: connect a Pico running MicroPython "
                                             "over USB, or pass --port /dev/ttyACM0"]


def test_model_dir_without_its_files_is_one_clear_line(model_dir, tmp_path):
    (tmp_path / "model.bin").write_bytes((model_dir / "model.bin").read_bytes())
    r = _cli(tmp_path, "--dry-run")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"error: {tmp_path} is missing vocab.bin, config.json: export it first with "
                                f"python -m rp2040.export CHECKPOINT --out {tmp_path}")


def test_mpremote_absent_is_one_clear_line(tmp_path):
    with pytest.raises(PiconeoxError, match=r"^mpremote not found: install it with"):
        flash.find_mpremote(search_path=str(tmp_path))


def test_files_that_do_not_fit_the_free_flash(model_dir):
    files = flash.board_files(model_dir, mpy=False, build_dir=model_dir, prompt=None)
    need = flash.space_needed(files, 4096)  # whole blocks per file, two per folder, some spare
    blocks = sum(-(-p.stat().st_size // 4096) for p in files.values())
    assert need == (blocks + 2 * 4 + flash.SPARE_BLOCKS) * 4096  # folders: stage, /lib, /lib/piconeox, /model
    assert flash.check_fits(files, files, need, 4096, old=0) is False  # fits beside the current install
    assert flash.check_fits(files, files, need - 1, 4096, old=4096) is True  # fits once the old one is gone
    model = {d: h for d, h in files.items() if d.startswith("/model/")}
    assert flash.check_fits(model, files, flash.space_needed(model, 4096), 4096, old=0) is False  # only new files
    with pytest.raises(PiconeoxError, match=rf"^{len(files)} files need {need:,} bytes of flash but the board has "
                                            rf"{need - 1:,} \(free {need - 4097:,} \+ the current install 4,096; "
                                            r"largest file: model.bin, 16,968 bytes\)"):
        flash.check_fits(files, files, need - 4097, 4096, old=4096)


def test_a_port_that_cannot_be_opened_is_one_line(model_dir, tmp_path):
    r = _cli(model_dir, "--port", tmp_path / "ttyACM9")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"error: no MicroPython REPL answered on {tmp_path / 'ttyACM9'} (mpremote: "
                                     f"failed to access {tmp_path / 'ttyACM9'} (it may be in use by another "
                                     "program)): is it a Pico running MicroPython?"]


def test_a_port_that_is_not_a_micropython_repl_is_one_line(model_dir):
    """An HTTP server: it answers mpremote's Ctrl-C / Ctrl-A with a 400 and hangs up."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer():
        conn, _ = server.accept()
        conn.recv(64)
        conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
        # Hang up our side, then read until the client closes: closing with its bytes unread would
        # send a reset instead of the end-of-stream this test is about.
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(4096):
            pass
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    port = f"socket://127.0.0.1:{server.getsockname()[1]}"
    r = _cli(model_dir, "--mpy", "--prompt", "Hi", "--port", port)
    server.close()
    assert r.returncode == 2
    assert re.fullmatch(rf"error: no MicroPython REPL answered on {port} \(SerialException: (read failed: )?socket "
                        r"disconnected\): is it a Pico running MicroPython\?\n", r.stderr), r.stderr
