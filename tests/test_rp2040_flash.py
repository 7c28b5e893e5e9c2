"""rp2040.flash without a board: the --dry-run plan, and one clear line for each failure."""
import subprocess
import sys
from pathlib import Path

import pytest

from configs.model import MODEL_PRESETS, build_model
from rp2040 import flash
from rp2040.export import export
from utils.errors import PiconeoxError
from utils.data.tokenizers import build_tokenizer, save_tokenizer

REPO = Path(__file__).resolve().parent.parent


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


def test_dry_run_prints_the_plan(model_dir):
    r = _cli(model_dir, "--port", "/dev/ttyACM0", "--dry-run", "--prompt", "Once upon a time")
    assert r.returncode == 0, r.stderr
    commands = [line for line in r.stdout.splitlines() if "mpremote" in line and not line.startswith("#")]
    assert all(" connect /dev/ttyACM0 " in c for c in commands)
    copies = {c.split(":")[-1] for c in commands if " fs cp " in c}
    assert {"/main.py", "/lib/piconeox/gpt.py", "/lib/piconeox/kernels_native.py", "/model/model.bin",
            "/model/vocab.bin", "/model/config.json", "/prompt.txt"} <= copies
    assert commands[0].split(" exec ")[1].count("/lib/piconeox") == 1  # directories made first
    assert commands[-1].endswith("exec 'import main'")


def test_dry_run_mpy_copies_native_bytecode(model_dir):
    r = _cli(model_dir, "--dry-run", "--mpy", "--prompt", "Hi")
    assert r.returncode == 0, r.stderr
    built = [line.split()[-2] for line in r.stdout.splitlines() if " fs cp " in line and "/model/" not in line
             and "main.py" not in line]
    assert built and all(p.startswith("<build>/") for p in built)  # not a temp path deleted on exit
    assert ":/lib/piconeox/kernels_native.mpy" in r.stdout and ":/lib/piconeox/gpt.py" not in r.stdout
    assert ":/main.py" in r.stdout  # the board boots main.py from source
    assert "exec 'import main'" in r.stdout.splitlines()[-1]


def test_dry_run_without_prompt_resets_into_the_repl(model_dir):
    r = _cli(model_dir, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].endswith(" reset")  # no --prompt: reboot into the REPL prompt


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
    total = sum(p.stat().st_size for p in files.values())
    flash.check_fits(files, total)
    with pytest.raises(PiconeoxError, match=rf"^{len(files)} files need {total:,} bytes but the board has "
                                            rf"{total - 1:,} bytes of free flash \(largest: model.bin, 16,968 bytes\)"):
        flash.check_fits(files, total - 1)
