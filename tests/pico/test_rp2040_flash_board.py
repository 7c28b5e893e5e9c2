"""rp2040.flash against a board: the emulated Pico (real MicroPython firmware in rp2040js, ../shared/pico) with
its USB serial on a TCP port (rp2040.serve), flashed by the README's command through mpremote.

Emulation costs ~10 s of wall time per emulated second and mpremote copies ~5 KB/s to it, so the models are
tiny (char vocabulary, hidden 8, one layer) and generate 4 tokens; one booted board serves the cases in order.
"""
import hashlib
import json
import re
import tempfile
from pathlib import Path

import pytest

from configs.model import ModelConfig, build_model
from rp2040 import emulate
from rp2040.bundle import compile_runtime, runtime_files
from rp2040.export import export
from rp2040.flash import BOARD_SCRIPT, STAGE
from rp2040.serve import EmulatedPico
from tests.support.paths import REPO
from tests.support.pico_boards import PROMPT, TOKENS, expected_text, flash, mpremote
from tests.support.rp2040_models import wide_init
from utils.data.tokenizers import build_tokenizer, save_tokenizer

pytestmark = pytest.mark.skipif(emulate.unavailable() is not None, reason=str(emulate.unavailable()))


def tiny_model(out: Path, seed: int) -> Path:
    """An int8 export of a ~1K-parameter model over the prompt's characters, generating TOKENS tokens."""
    tok = build_tokenizer("char", [PROMPT], None)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), hidden_size=8, num_layers=1, num_heads=4, intermediate_size=16,
                      max_position_embeddings=32, rotary_pct=1.0, tie_word_embeddings=True)
    wide_init(build_model(cfg), seed).save_pretrained(out / "ckpt")
    save_tokenizer(tok, out / "ckpt" / "tokenizer.json")
    export(out / "ckpt", out / "model", "int8")
    config = json.loads((out / "model" / "config.json").read_text())
    config["generation"].update(max_new_tokens=TOKENS, top_k=5)  # the runtime defaults main.py reads
    (out / "model" / "config.json").write_text(json.dumps(config))
    return out / "model"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return [tiny_model(tmp_path_factory.mktemp(f"model{seed}"), seed) for seed in (0, 1)]


@pytest.fixture(scope="module")
def pico():
    with EmulatedPico() as board:
        yield board


def board_tree(port: str) -> dict[str, int]:
    """Every file on the board: path -> size."""
    code = ("import os\ndef w(p):\n for n, k, _, s in os.ilistdir(p or '/'):\n"
            "  yield from w(p + '/' + n) if k == 0x4000 else [(p + '/' + n, s)]\nprint(dict(w('')))")
    return eval(mpremote(port, "exec", code).strip())


def generated(stdout: str) -> str:
    """main.py's text: what follows the start line, up to the tokens/s line."""
    return stdout.split("==> run main.py and stream its output\n", 1)[1].split("\n[", 1)[0].rstrip("\r\n")


def test_flash_copies_byte_for_byte_and_the_board_generates_the_reference_ids(pico, models, tmp_path):
    r = flash(models[0], pico.url)
    assert r.returncode == 0, r.stderr
    assert generated(r.stdout).replace("\r", "") == expected_text(models[0])
    assert f"[{TOKENS} tokens" in r.stdout
    tree = board_tree(pico.url)
    assert not [p for p in tree if p.startswith((STAGE, "/.piconeox"))]  # nothing staged is left
    assert tree["/model/model.bin"] == (models[0] / "model.bin").stat().st_size
    assert {p.rsplit("/", 1)[0] for p in tree} == {"", "/lib/piconeox", "/model"}
    mpremote(pico.url, "fs", "cp", ":/model/model.bin", ":/model/vocab.bin", ":/model/config.json", ":/main.py",
             ":/prompt.txt", str(tmp_path))
    for name in ("model.bin", "vocab.bin", "config.json"):
        assert (tmp_path / name).read_bytes() == (models[0] / name).read_bytes()
    assert (tmp_path / "main.py").read_bytes() == (REPO / "rp2040" / "runtime" / "main.py").read_bytes()
    assert (tmp_path / "prompt.txt").read_text() == PROMPT
    (tmp_path / "built").mkdir()
    built = compile_runtime(runtime_files(), tmp_path / "built", march="armv6m")  # mpy-cross is deterministic
    package = {dev: host for dev, host in built.items() if dev != "/main.py"}
    assert sorted(p for p in tree if p.startswith("/lib/")) == sorted(package)
    # the runtime by mpremote's own sha256 on the board (reading it back would cost ~4x the traffic)
    out = mpremote(pico.url, "fs", "sha256sum", *(":" + dev for dev in package)).split()
    board = [w for w in out if re.fullmatch("[0-9a-f]{64}", w)]  # between its "sha256sum :PATH" lines
    assert board == [hashlib.sha256(host.read_bytes()).hexdigest() for host in package.values()]


def test_a_reset_mid_copy_keeps_the_old_model_and_the_next_flash_replaces_it(pico, models):
    if board_tree(pico.url).get("/model/model.bin") is None:  # run alone: the first test's install
        assert flash(models[0], pico.url).returncode == 0
    # The probe and prepare scripts go first (board_install.py each), then model.bin's copy (~13 KB of traffic)
    pico.reset(after_bytes=2 * len(BOARD_SCRIPT.read_text()) + 4000)
    r = flash(models[1], pico.url)
    assert r.returncode == 2
    assert re.fullmatch(rf"error: flashing {pico.url} stopped \(SerialException: (read failed: )?socket "
                        r"disconnected\): nothing was installed, the board keeps its previous install; run the same "
                        r"command again\n",
                        r.stderr), r.stderr
    tree = board_tree(pico.url)
    assert tree[f"{STAGE}/model/model.bin"] < (models[1] / "model.bin").stat().st_size  # it stopped mid-copy
    with tempfile.TemporaryDirectory() as tmp:
        mpremote(pico.url, "fs", "cp", ":/model/model.bin", ":/model/config.json", tmp)
        for name in ("model.bin", "config.json"):
            assert (Path(tmp) / name).read_bytes() == (models[0] / name).read_bytes()
    boot = mpremote(pico.url, "exec", "import main")  # what main.py runs at power-on: the old model, whole
    assert boot.replace("\r", "").startswith(expected_text(models[0]) + "\n[")

    r = flash(models[1], pico.url)
    assert r.returncode == 0, r.stderr
    assert "copy 2 files (" in r.stdout and "keep 17 unchanged" in r.stdout  # vocab.bin and the runtime stay
    assert generated(r.stdout).replace("\r", "") == expected_text(models[1]) != expected_text(models[0])
    tree = board_tree(pico.url)
    assert not [p for p in tree if p.startswith("/.piconeox")]
    with tempfile.TemporaryDirectory() as tmp:
        mpremote(pico.url, "fs", "cp", ":/model/model.bin", ":/model/config.json", tmp)
        for name in ("model.bin", "config.json"):
            assert (Path(tmp) / name).read_bytes() == (models[1] / name).read_bytes()


def test_a_board_without_room_is_refused_before_anything_is_copied(models, tmp_path):
    filler = tmp_path / "filler.bin"
    filler.write_bytes(bytes(330 * 4096))  # of the 352 blocks: ~70 KB stay free, the install needs more
    with EmulatedPico(files={"/filler.bin": filler}) as small:
        r = flash(models[0], small.url)
        assert r.returncode == 2
        assert re.fullmatch(r"error: 19 files need [\d,]+ bytes of flash but the board has [\d,]+ \(free [\d,]+ \+ "
                            r"the current install 0; largest file: kernels_native.mpy, [\d,]+ bytes\); use --mpy "
                            r"or a smaller model, or delete files on it\n", r.stderr), r.stderr
        assert board_tree(small.url) == {"/filler.bin": filler.stat().st_size}

