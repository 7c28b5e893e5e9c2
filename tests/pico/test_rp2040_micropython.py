"""The RP2040 runtime inside real MicroPython (WebAssembly port under node) against PyTorch (f32) and
the integer reference (int8).

Models are the Pico presets at random init (fixed seed) with the byte tokenizer, exported
through rp2040.export exactly as a trained checkpoint would be.
"""
import json

import pytest
import torch

from rp2040 import wasm
from rp2040.export import export
from rp2040.reference import ReferenceModel, generate
from rp2040.runtime.generate import Generator, load
from rp2040.runtime.sampling import Sampler
from tests.support.rp2040_models import save_checkpoint

PRESETS = ("rp2040-speed", "rp2040-optimized", "rp2040-quality", "pico-fast", "pico-best")
IDS = [72, 101, 108, 108, 111, 32, 119, 111]  # "Hello wo" in byte ids

pytestmark = pytest.mark.skipif(wasm.unavailable() is not None, reason=str(wasm.unavailable()))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """preset -> (HF checkpoint dir, torch model)."""
    out = {}
    for i, preset in enumerate(PRESETS):
        out[preset] = save_checkpoint(preset, tmp_path_factory.mktemp(preset), seed=i)
    return out


def _export(checkpoints, preset, dtype, tmp_path):
    src, model = checkpoints[preset]
    cfg = export(src, tmp_path / f"{preset}-{dtype}", dtype)
    return tmp_path / f"{preset}-{dtype}", model, cfg


LOAD = ("from piconeox.generate import load, Generator\nfrom piconeox.sampling import Sampler\n"
        "model, tok, cfg = load('/model')\n")


@pytest.mark.parametrize("preset", PRESETS)
def test_f32_logits_match_pytorch(checkpoints, preset, tmp_path):
    model_dir, model, cfg = _export(checkpoints, preset, "f32", tmp_path)
    run = LOAD + "".join(f"print(list(model.forward({t}, {p})))\n" for p, t in enumerate(IDS))
    out = wasm.run([run], model_dir)[0].stdout.splitlines()
    got = torch.tensor([json.loads(line) for line in out])
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0]
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() <= 1e-4
    assert cfg["runtime"]["stream"] == (preset != "rp2040-speed")  # over 100 KB in RAM: streamed from flash


@pytest.mark.parametrize("preset", PRESETS)
def test_int8_runtime_in_micropython_equals_the_integer_reference(checkpoints, preset, tmp_path):
    """The plain-Python integer kernels in real MicroPython give the host reference's ids exactly,
    greedy and sampled (the board's viper kernels are checked in test_rp2040_emulator.py)."""
    model_dir, _, _ = _export(checkpoints, preset, "int8", tmp_path)
    run = LOAD + (f"gen = Generator(model, Sampler(model.h.vocab))\ngen.prompt({IDS[:4]})\n"
                  "print([gen.step() for _ in range(24)])\n"
                  "model, tok, cfg = load('/model')\n"
                  f"gen = Generator(model, Sampler(model.h.vocab, 0.9, 20, 1234))\ngen.prompt({IDS})\n"
                  "print([gen.step() for _ in range(24)])")
    greedy, sampled = map(json.loads, wasm.run([run], model_dir)[0].stdout.splitlines())
    ref = ReferenceModel(model_dir / "model.bin")
    assert greedy == generate(ref, IDS[:4], 24, 0.0, 0, 0)
    assert sampled == generate(ref, IDS, 24, 0.9, 20, 1234)
    assert len(set(sampled)) > 3  # really sampled, not a greedy loop


@pytest.mark.parametrize("dtype", ["int8", "f32"])
def test_micropython_and_cpython_sample_the_same_tokens(checkpoints, dtype, tmp_path):
    model_dir, _, _ = _export(checkpoints, "rp2040-speed", dtype, tmp_path)
    run = LOAD + ("gen = Generator(model, Sampler(model.h.vocab, temperature=0.9, top_k=20, seed=1234))\n"
                  f"gen.prompt({IDS})\nprint([gen.step() for _ in range(24)])")
    got = json.loads(wasm.run([run], model_dir)[0].stdout)

    model, _, _ = load(str(model_dir))
    gen = Generator(model, Sampler(model.h.vocab, temperature=0.9, top_k=20, seed=1234))
    gen.prompt(IDS)
    assert got == [gen.step() for _ in range(24)]
    assert len(set(got)) > 3  # really sampled, not a greedy loop


def test_bytecode_mpy_runs_in_micropython(checkpoints, tmp_path):
    """The runtime precompiled by mpy-cross (no -march: portable bytecode) imports and generates."""
    model_dir, _, _ = _export(checkpoints, "rp2040-speed", "int8", tmp_path)
    run = ("import piconeox.gpt\nprint(piconeox.gpt.__file__)\n" + LOAD +
           "gen = Generator(model, Sampler(model.h.vocab))\ngen.prompt([72, 105])\n"
           "print([gen.step() for _ in range(8)])")
    out = wasm.run([run], model_dir, mpy=True)[0].stdout.splitlines()
    assert out[0].endswith("gpt.mpy")
    source = wasm.run([run], model_dir, mpy=False)[0].stdout.splitlines()
    assert source[0].endswith("gpt.py") and out[1] == source[1]


def test_main_py_streams_text_and_reports_speed(checkpoints, tmp_path):
    model_dir, _, _ = _export(checkpoints, "rp2040-speed", "int8", tmp_path)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["generation"]["max_new_tokens"] = 6
    (model_dir / "config.json").write_text(json.dumps(cfg))
    run = "open('/prompt.txt', 'w').write('Hi')\nimport main"
    out = wasm.run([run], model_dir)[0].stdout
    assert out.startswith("Hi")
    assert "tokens/s]" in out.splitlines()[-1]


def test_main_py_with_a_truncated_or_foreign_model_prints_one_line(checkpoints, tmp_path):
    """main.py runs at every boot: a bad model.bin must be one line, not a traceback on each reset."""
    model_dir, _, _ = _export(checkpoints, "rp2040-speed", "int8", tmp_path)
    data = (model_dir / "model.bin").read_bytes()
    for content, line in [(data[:-3], "error: model.bin is truncated"),
                          (b"GGUF" + data[4:], "error: not a piconeox model.bin (bad magic)")]:
        (model_dir / "model.bin").write_bytes(content)
        out = wasm.run(["open('/prompt.txt', 'w').write('Hi')\nimport main"], model_dir)[0].stdout
        assert out.strip().splitlines() == [line]
