"""The runtime on real RP2040 MicroPython firmware, booted in the rp2040js emulator (../shared/pico).

Emulation costs ~10 s of wall time per emulated second, so prompts stay short.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rp2040 import emulate
from rp2040.export import export
from tests.rp2040_models import save_checkpoint
from utils.errors import PiconeoxError

REPO = Path(__file__).resolve().parent.parent
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
