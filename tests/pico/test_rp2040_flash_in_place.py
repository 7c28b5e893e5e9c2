"""rp2040.flash of a model whose weights are read in place from raw flash (runtime/xip.py), against the emulated
Pico (real MicroPython firmware in rp2040js, rp2040.serve): model.bin goes into the flash before littlefs,
checked there by sha256, and the board generates the reference's ids from it; a board whose raw region holds
another model's weights, or none, is refused in one line, never run."""
import json
from pathlib import Path

import pytest

from configs.model import ModelConfig, build_model
from rp2040 import emulate
from rp2040.bundle import runtime_files
from rp2040.export import export
from rp2040.serve import EmulatedPico
from tests.support.pico_boards import PROMPT, TOKENS, expected_text, flash, mpremote
from tests.support.rp2040_models import wide_init
from utils.data.tokenizers import build_tokenizer, save_tokenizer

pytestmark = pytest.mark.skipif(emulate.unavailable() is not None, reason=str(emulate.unavailable()))


def in_place_model(out: Path, seed: int) -> Path:
    """A ~1K-parameter int8 export whose every matrix is in 4-row blocks, read in place (--in-place)."""
    tok = build_tokenizer("char", [PROMPT], None)
    cfg = ModelConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16,
                      max_position_embeddings=32, rotary_pct=1.0, tie_word_embeddings=True)
    wide_init(build_model(cfg), seed).save_pretrained(out / "ckpt")
    save_tokenizer(tok, out / "ckpt" / "tokenizer.json")
    export(out / "ckpt", out / "model", "int8", in_place_always=True)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["runtime"]["xip"]["bytes"] == (out / "model" / "model.bin").stat().st_size
    config["generation"].update(max_new_tokens=TOKENS, top_k=5)
    (out / "model" / "config.json").write_text(json.dumps(config))
    return out / "model"


def test_in_place_weights_are_flashed_raw_run_and_a_foreign_region_is_refused(tmp_path):
    a, b = in_place_model(tmp_path / "a", 0), in_place_model(tmp_path / "b", 1)
    with EmulatedPico() as pico:
        r = flash(a, pico.url)
        assert r.returncode == 0, r.stderr
        out = r.stdout.split("==> run main.py and stream its output\n", 1)[1].split("\n[", 1)[0]
        assert out.replace("\r", "").rstrip("\n") == expected_text(a)
        files = mpremote(pico.url, "exec", "import os; print(os.listdir('/model'))")
        assert "model.bin" not in files and "config.json" in files  # the weights live in raw flash only
        size = (a / "model.bin").stat().st_size
        raw = mpremote(pico.url, "exec", f"import machine\nprint(bytes(machine.mem8[0x10053000 + i] for i in "
                                         f"range({size})).hex())").strip()
        assert bytes.fromhex(raw) == (a / "model.bin").read_bytes()
        # b's config.json beside a's weights: one line from main.py, no generation
        mpremote(pico.url, "fs", "cp", str(b / "config.json"), ":/model/config.json")
        boot = mpremote(pico.url, "exec", "import main").replace("\r", "")
        assert boot.startswith("error: the raw flash region holds another model's weights (CRC-32 "), boot
        assert boot.count("\n") == 1 and "flash this model again with python -m rp2040.flash" in boot
    # a board with the runtime and b's files but nothing in raw flash
    (tmp_path / "prompt.txt").write_text(PROMPT)
    files = {**runtime_files(), "/model/config.json": b / "config.json", "/model/vocab.bin": b / "vocab.bin",
             "/prompt.txt": tmp_path / "prompt.txt"}
    with EmulatedPico(files=files) as new:
        boot = mpremote(new.url, "exec", "import main").replace("\r", "")
        assert boot == ("error: the raw flash region holds no model: flash this model again with "
                        "python -m rp2040.flash\n")
