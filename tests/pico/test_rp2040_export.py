"""rp2040.export: the format read back by the runtime, refusals, checkpoint forms, and vocab.bin."""
import json
import subprocess
import sys

import pytest
import torch

from configs.model import MODEL_PRESETS, ModelConfig, build_model
from rp2040.export import export
from rp2040.runtime.gpt import GPT
from rp2040.runtime.modelfile import FormatError
from rp2040.runtime.tokenizer import StreamDecoder, Tokenizer
from rp2040.vocab_bin import Vocab
from tests.support.bounds import bound
from tests.support.cli import call_cli
from tests.support.paths import REPO
from utils.ckpt.format import manifest, write_marker
from utils.data.tokenizers import build_tokenizer, save_tokenizer
from utils.errors import PiconeoxError

# Not a preset: untied head, sequential residual, half of each head rotary (4 of 8 dims).
ODD_SHAPE = ModelConfig(vocab_size=300, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=40,
                        max_position_embeddings=32, rotary_pct=0.5, tie_word_embeddings=False,
                        use_parallel_residual=False)


def _save(model, d, kind="byte", texts=(), vocab_size=None):
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d)
    save_tokenizer(build_tokenizer(kind, list(texts), vocab_size), d / "tokenizer.json")
    return d


def test_shape_comes_from_the_checkpoint_and_cpython_runtime_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    model = build_model(ODD_SHAPE).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.3)
    cfg = export(_save(model, tmp_path / "ckpt"), tmp_path / "out", "f32")
    assert cfg["shape"] == {"vocab": 300, "hidden": 16, "layers": 2, "heads": 2, "inter": 40, "context": 32,
                            "rotary_dims": 4, "norm_eps": 1e-5, "rotary_base": 10000.0, "tied": False,
                            "parallel_residual": False}
    g = GPT(str(tmp_path / "out" / "model.bin"))
    assert (g.h.vocab, g.h.hidden, g.h.rotary_dims, g.h.tied, g.h.parallel_residual) == (300, 16, 4, False, False)
    ids = [3, 250, 7, 99, 0, 299, 42, 42, 5, 17]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    got = torch.tensor([list(g.forward(t, p)) for p, t in enumerate(ids)])
    assert (got - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype", ["int8", "f32"])
def test_streaming_from_flash_computes_what_weights_in_ram_compute(tmp_path, dtype):
    """Untied head and sequential residual: every streamed read (layer W and P blocks, embedding row
    and scale, head chunks and their scales) lands where the in-RAM layout has it."""
    torch.manual_seed(1)
    model = build_model(ODD_SHAPE).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    export(_save(model, tmp_path / "ckpt"), tmp_path / "out", dtype)
    ram, flash = (GPT(str(tmp_path / "out" / "model.bin"), stream=s) for s in (False, True))
    assert flash.chunk < flash.h.vocab  # the streamed head really runs in several chunks
    ids = [299, 0, 150, 7, 7, 42, 298, 1]
    for pos, t in enumerate(ids):
        assert list(flash.forward(t, pos)) == list(ram.forward(t, pos))
    flash.close()


def test_cli_prints_sizes_and_ram_and_refuses_over_budget(tmp_path, capfd):
    ckpt = _save(build_model(MODEL_PRESETS["rp2040-quality"]), tmp_path / "ckpt")
    ok = call_cli(capfd, "rp2040.export", ckpt, "--out", tmp_path / "q8", "--dtype", "int8")
    assert ok.returncode == 0, ok.stderr
    assert "model.bin: 73,368 bytes" in ok.stdout and "estimated RAM:" in ok.stdout

    refused = call_cli(capfd, "rp2040.export", ckpt, "--out", tmp_path / "q32", "--dtype", "f32", "--ram-budget-kb",
                       "60")
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "60 KB budget" in lines[0]
    assert not (tmp_path / "q32").exists() or not any((tmp_path / "q32").iterdir())

    forced = call_cli(capfd, "rp2040.export", ckpt, "--out", tmp_path / "q32", "--dtype", "f32", "--ram-budget-kb",
                      "60", "--force")
    assert forced.returncode == 0 and "over the RAM budget" in forced.stderr
    assert sorted(p.name for p in (tmp_path / "q32").iterdir()) == ["config.json", "model.bin", "vocab.bin"]

    bad = call_cli(capfd, "rp2040.export", ckpt, "--out", tmp_path / "x", "--dtype", "f16")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --dtype 'f16' is not allowed; use one of f32, int8"


def test_checkpoint_forms(tmp_path):
    model = build_model(MODEL_PRESETS["rp2040-speed"])
    step = _save(model, tmp_path / "run" / "step-00000100")
    with pytest.raises(PiconeoxError, match="no COMPLETE marker"):
        export(step, tmp_path / "a")
    write_marker(step, 100, 1, manifest(step, [p.name for p in step.iterdir()]))
    assert export(step, tmp_path / "a")["source"] == str(step)
    with pytest.raises(PiconeoxError, match="run folder without best/ or final/: give one of its steps"):
        export(tmp_path / "run", tmp_path / "b")
    _save(model, tmp_path / "run" / "final")
    _save(model, tmp_path / "run" / "best")
    assert export(tmp_path / "run", tmp_path / "b")["source"] == str(tmp_path / "run" / "best")


def test_corrupt_model_bin_is_refused_by_the_runtime(tmp_path):
    export(_save(build_model(MODEL_PRESETS["rp2040-speed"]), tmp_path / "ckpt"), tmp_path / "out", "int8")
    path = tmp_path / "out" / "model.bin"
    data = bytearray(path.read_bytes())
    data[5000] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="checksum mismatch"):
        GPT(str(path))
    path.write_bytes(bytes(data[:3000]))
    with pytest.raises(FormatError, match="truncated"):
        GPT(str(path))


@pytest.mark.parametrize("kind, vocab_size", [("byte", None), ("char", None), ("bpe", 1024)])
def test_device_tokenizer_matches_training_tokenizer_on_real_text(shared_data, tmp_path, kind, vocab_size):
    train_text = (shared_data / "tinystories" / "tinystories_10k.txt").read_text(encoding="utf-8")[:300_000]
    text = (shared_data / "tinystories" / "tinystories_val.txt").read_text(encoding="utf-8")[:6000]
    hf = build_tokenizer(kind, [train_text, text], vocab_size)
    save_tokenizer(hf, tmp_path / "tokenizer.json")
    vocab = Vocab.from_tokenizer_json(tmp_path / "tokenizer.json", hf.get_vocab_size())
    (tmp_path / "vocab.bin").write_bytes(vocab.encode())
    tok = Tokenizer(str(tmp_path / "vocab.bin"))
    assert tok.kind == kind and tok.eos == hf.token_to_id("<|endoftext|>")
    expected = hf.encode(text, add_special_tokens=False).ids
    assert tok.encode(text) == expected
    dec = StreamDecoder(tok)
    assert "".join(dec.feed(t) for t in expected) == text
    assert tok.token(tok.eos) == b""


def test_config_json_is_what_main_py_reads(tmp_path):
    export(_save(build_model(MODEL_PRESETS["rp2040-optimized"]), tmp_path / "ckpt"), tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["dtype"] == "int8" and cfg["tokenizer"]["kind"] == "byte"
    assert set(cfg["generation"]) == {"max_new_tokens", "temperature", "top_k", "seed"}
    assert cfg["files"]["model.bin"] == (tmp_path / "out" / "model.bin").stat().st_size


def test_run_cli_generates_on_the_host(tmp_path, capfd):
    export(_save(build_model(MODEL_PRESETS["rp2040-speed"]), tmp_path / "ckpt"), tmp_path / "m")
    r = subprocess.run([sys.executable, "-m", "rp2040.run", tmp_path / "m", "--prompt", "Once upon",
                        "--max-new-tokens", "5", "--temperature", "0"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Once upon") and r.stdout.rstrip().endswith("tokens/s]")
    assert "[5 tokens," in r.stdout or "tokens," in r.stdout.splitlines()[-1]  # fewer if end-of-text came
    for flag, value, allowed in [("--temperature", "nan", "a finite number >= 0"), ("--temperature", "-1", ">= 0"),
                                 ("--top-k", "-5", ">= 0"), ("--max-new-tokens", "0", ">= 1")]:
        r = call_cli(capfd, "rp2040.run", tmp_path / "m", flag, value)
        assert r.returncode == 2 and r.stdout == "", (flag, value, r.stdout)
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith(f"error: {flag} ") and allowed in r.stderr
    missing = call_cli(capfd, "rp2040.run", tmp_path / "nope")
    assert missing.returncode == 2 and missing.stderr.startswith(f"error: {tmp_path / 'nope'} is missing model.bin")


def test_run_says_why_it_stopped_and_escapes_control_characters(tmp_path):
    """A generation cut short by the context says so; an ESC in the prompt is shown, not obeyed."""
    from tests.support.rp2040_models import save_checkpoint

    export(save_checkpoint("rp2040-speed", tmp_path / "ckpt")[0], tmp_path / "m", "int8")
    context = json.loads((tmp_path / "m" / "config.json").read_text())["shape"]["context"]
    r = subprocess.run([sys.executable, "-m", "rp2040.run", str(tmp_path / "m"), "--prompt", "\x1b[2JHi",
                        "--max-new-tokens", "100000", "--temperature", "0"], capture_output=True, text=True,
                       cwd=REPO, timeout=bound(150))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and r.stdout.startswith("\\x1b[2JHi")
    assert f"stopped after {context - 6} of 100000 tokens: the model's context is {context} tokens (6 of the prompt" \
        in r.stdout  # the byte tokenizer: 6 characters, 6 tokens
