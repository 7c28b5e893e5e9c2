"""The runtime on real RP2040 MicroPython firmware, booted in the rp2040js emulator (../shared/pico).

Emulation costs ~10 s of wall time per emulated second, so prompts stay short.
"""
import json
import subprocess
import sys

import pytest

from rp2040 import emulate
from rp2040.export import export
from tests.support.paths import REPO
from tests.support.rp2040_models import save_checkpoint
from utils.errors import PiconeoxError

needs_emulator = pytest.mark.skipif(emulate.unavailable() is not None, reason=str(emulate.unavailable()))


@pytest.fixture(scope="module")
def speed_int8(tmp_path_factory):
    d = tmp_path_factory.mktemp("emu")
    export(save_checkpoint("rp2040-speed", d / "ckpt")[0], d / "speed", "int8")
    return d / "speed"


@needs_emulator
def test_emulated_pico_generates_the_host_ids(speed_int8):
    run = emulate.emulate(speed_int8, prompt="Hi", tokens=8, progress=False)
    assert run.prompt_ids == [72, 105]
    assert len(run.ids) == 8 and run.ids == emulate.host_ids(speed_int8, run.prompt_ids, 8)
    assert 0 < run.heap_min <= run.heap_loaded < run.heap_imported < emulate.HEAP_BYTES
    # the exporter's streaming-or-RAM choice rests on this prediction of the board's heap
    predicted = json.loads((speed_int8 / "config.json").read_text())["ram"]["free_after_load_bytes"]
    assert abs(run.heap_loaded - predicted) < 1024
    assert all(0 < s < t for s, t in zip(run.sample_us, run.step_us)) and run.tok_per_s > 0


def test_truncated_or_foreign_model_is_one_line(speed_int8, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("vocab.bin", "config.json"):
        (bad / name).write_bytes((speed_int8 / name).read_bytes())
    data = (speed_int8 / "model.bin").read_bytes()
    for content, why in [(data[:-3], "truncated"), (b"GGUF" + data[4:], "bad magic")]:
        (bad / "model.bin").write_bytes(content)
        with pytest.raises(PiconeoxError, match=why):
            emulate.emulate(bad, tokens=1, progress=False)


def test_missing_firmware_is_one_clear_line(speed_int8, tmp_path):
    r = subprocess.run([sys.executable, "-m", "rp2040.emulate", speed_int8, "--firmware", tmp_path / "none.uf2"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: --firmware {tmp_path / 'none.uf2'} does not exist; give a "
                                             "RPI_PICO MicroPython .uf2 (https://micropython.org/download/RPI_PICO/)"]


@needs_emulator
def test_a_uf2_that_boots_nothing_stops_at_the_boot_deadline(speed_int8, tmp_path, monkeypatch):
    """A valid RP2040 UF2 without MicroPython (zeros at the flash start): the boot ROM finds no program and the
    board never answers; the boot deadline stops it instead of the wall-clock limit (deadlines made short)."""
    from tests.support.rp2040_models import uf2_block

    blank = tmp_path / "blank.uf2"
    blank.write_bytes(uf2_block(0xE48BFF56))
    monkeypatch.setattr(emulate, "BOOT_S", 0.25)  # MicroPython answers after 0.017
    monkeypatch.setattr(emulate, "BOOT_WALL_S", 2.0)  # the blank board's clock barely moves: this one ends it
    # the boot deadline's own error: the wall-clock limit (max_wall_s) ends a run with another message
    with pytest.raises(PiconeoxError, match="did not reach the MicroPython REPL within 0.25 emulated seconds"):
        emulate.emulate(speed_int8, tokens=1, firmware=blank, bootrom=emulate.SHARED_PICO / emulate.BOOTROM,
                        progress=False, max_wall_s=300)


def test_skip_reasons_say_where_to_get_what_is_missing(monkeypatch, tmp_path):
    """A bare clone's skips name the download page, not only what is missing."""
    from rp2040 import wasm
    from tests.support.paths import SHARED_DATA_MISSING

    for url in ("karpathy/char-rnn", "roneneldan/TinyStories", "pytorch/examples"):
        assert url in SHARED_DATA_MISSING
    monkeypatch.setattr(emulate, "SHARED_PICO", tmp_path)
    with pytest.raises(PiconeoxError, match=r"https://micropython.org/download/RPI_PICO/"):
        emulate.find_firmware(None, None)
    (tmp_path / "micropython-v1.28.0-rpi_pico.uf2").write_bytes(b"")
    with pytest.raises(PiconeoxError, match=r"https://github.com/raspberrypi/pico-bootrom"):
        emulate.find_firmware(None, None)
    monkeypatch.setattr(emulate.shutil, "which", lambda name, **kw: None)
    assert "https://nodejs.org/" in emulate.tools_missing() and "https://nodejs.org/" in wasm.unavailable()
