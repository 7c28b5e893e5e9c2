"""pico-million (~988K parameters) on the emulated Pico (real MicroPython firmware in rp2040js): its int8 weights fit
neither the heap nor the raw gap before littlefs, so the export reads them in place from model.blk's littlefs
blocks (rp2040/blockfile.py, runtime/lfsblocks.py), without --force; the board's token ids equal the integer
reference's; a board whose littlefs holds another model's blocks is refused in one line, never run."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from configs.model import MODEL_PRESETS
from rp2040 import emulate
from rp2040.blockfile import block_file
from rp2040.export import export
from rp2040.flash import board_files
from rp2040.runtime.lfsblocks import LFS_BLOCK, plan, pointers
from rp2040.runtime.modelfile import HEADER_SIZE, Header, Layout
from rp2040.serve import EmulatedPico
from tests.support.bounds import bound
from tests.support.rp2040_models import save_checkpoint

PROMPT = "Once"
TOKENS = 3
pytestmark = pytest.mark.skipif(emulate.unavailable() is not None, reason=str(emulate.unavailable()))


def million(out: Path, seed: int) -> Path:
    """pico-million at the wide random init, exported as int8 with the exporter's defaults (no --force)."""
    save_checkpoint("pico-million", out / "ckpt", seed)
    config = export(out / "ckpt", out / "model", "int8")
    assert config["runtime"]["blocks"]["blocks"] > 256 and not config["runtime"]["stream"]
    return out / "model"


def test_pico_million_is_a_million_parameters_read_in_place_from_littlefs_blocks_with_ids_equal(tmp_path):
    cfg = MODEL_PRESETS["pico-million"]
    params = cfg.vocab_size * cfg.hidden_size + cfg.num_layers * (
        4 * cfg.hidden_size ** 2 + 2 * cfg.hidden_size * cfg.intermediate_size)
    assert params >= 900_000  # the matrices alone
    model = million(tmp_path, 0)
    run = emulate.emulate(model, PROMPT, TOKENS, progress=False)
    tok_ids = run.prompt_ids
    assert run.ids == emulate.host_ids(model, tok_ids, TOKENS)
    assert run.heap_min > 0 and run.tok_per_s > 0


def test_a_board_holding_another_models_blocks_is_refused_in_one_line(tmp_path):
    a, b = million(tmp_path / "a", 0), million(tmp_path / "b", 1)
    header = Header((b / "model.bin").read_bytes()[:HEADER_SIZE])
    first, _, _ = plan(header, Layout(header))
    cut = sum(LFS_BLOCK - pointers(n) for n in range(first))  # b's header and P, then a's weight blocks
    mixed = block_file((b / "model.bin").read_bytes())[:cut] + block_file((a / "model.bin").read_bytes())[cut:]
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "model.blk").write_bytes(mixed)
    files = {**board_files(b, True, tmp_path, PROMPT), "/model/model.blk": tmp_path / "mixed" / "model.blk"}
    with EmulatedPico(files=files) as pico:
        r = subprocess.run([sys.executable, "-m", "mpremote", "connect", pico.url, "exec", "import main"],
                           capture_output=True, text=True, timeout=bound(150))
    assert r.returncode == 0, r.stderr
    boot = r.stdout.replace("\r", "")
    blocks = json.loads((b / "config.json").read_text())["runtime"]["blocks"]["blocks"] - first
    assert boot == (f"error: the flash holds 0 of this model's {blocks} weight blocks (another model's, or a copy "
                    "cut short): flash this model again with python -m rp2040.flash\n"), boot
