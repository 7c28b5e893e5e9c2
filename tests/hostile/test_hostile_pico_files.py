"""Pico files and boards that lie: a model.bin or vocab.bin longer than its header says, a link in a model folder, an
export claiming infinite RAM, a board's unexpected or hostile answers. Each test failed on main 0a6935d before its
check existed (what it saw then is in its docstring).
"""
import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.cli import assert_error_line
from utils.errors import PiconeoxError


@pytest.fixture(scope="module")
def pico(tmp_path_factory) -> Path:
    from tests.support.rp2040_models import exported_pico

    return exported_pico(tmp_path_factory.mktemp("pico"))[1]


def pico_copy(pico: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pico, tmp_path / "model"))


def test_pico_files_are_read_as_their_header_says_and_no_further(tmp_path, pico):
    """main: a model.bin or vocab.bin padded to 3 GB passed the checks and was read whole (3 GB of RSS)."""
    from rp2040.bundle import check_model

    for name in ("model.bin", "vocab.bin"):
        model = pico_copy(pico, tmp_path / name)
        with open(model / name, "r+b") as f:
            f.truncate(3 << 30)  # sparse: nothing written
        with pytest.raises(PiconeoxError, match=f"{name} has 3,221,225,472 bytes, its header says"):
            check_model(model / "model.bin")


def test_a_pico_folder_holds_regular_files_only(tmp_path, pico):
    """main: flash copied, and run ran, a model.bin linked from outside the folder."""
    from rp2040.bundle import model_files

    model, outside = pico_copy(pico, tmp_path), tmp_path / "outside.bin"
    shutil.move(model / "model.bin", outside)
    (model / "model.bin").symlink_to(outside)
    with pytest.raises(PiconeoxError, match="model.bin is a symbolic link"):
        model_files(model)


def test_an_export_claiming_infinite_ram_is_one_line(tmp_path, pico, capsys):
    """main: OverflowError traceback (int(inf)) from rp2040.run."""
    from rp2040.run import main

    model = pico_copy(pico, tmp_path)
    config = json.loads((model / "config.json").read_text())
    config["ram"]["free_after_load_bytes"] = float("inf")
    (model / "config.json").write_text(json.dumps(config))  # Python writes Infinity
    assert main([str(model), "--prompt", "hi", "--max-new-tokens", "1"]) == 2
    assert_error_line(capsys.readouterr().err, "ram.free_after_load_bytes inf is not a whole number")


def board(*lines: str) -> list[str]:
    """An mpremote stand-in that prints `lines` (the board's "@@" answers) whatever it is asked."""
    return [sys.executable, "-c", f"print({chr(10).join(lines)!r})"]


def test_the_boards_answers_are_checked_and_escaped(tmp_path, pico):
    """main: an unexpected probe answer was a ValueError traceback; a board's "@@ error" text reached the terminal
    raw (here: an escape sequence that retitles the window)."""
    from rp2040.bundle import model_files
    from rp2040.flash import Step, flash, run_board

    with pytest.raises(PiconeoxError) as e:
        run_board(Step("probe", board("@@ error \x1b]0;pwned\x07 no room")), "stopped ({why})")
    assert "\x1b" not in str(e.value) and "\\x1b]0;pwned\\x07 no room" in str(e.value)
    files = model_files(pico)
    for answer in (("@@ have /model/model.bin many", "@@ free 1 2 3", "@@ ok"), ("@@ free x y z", "@@ ok"), ("@@ ok",)):
        with pytest.raises(PiconeoxError, match="answered the probe with"):
            flash(files, board(*answer), "socket://board", tmp_path, start=False)
