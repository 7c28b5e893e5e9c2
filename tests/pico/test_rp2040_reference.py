"""rp2040/reference.py, the integer spec: its constants, its accuracy against PyTorch f32 on real
text, its CLI, and the CPython runtime (plain-Python twin) computing its exact integers."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from rp2040.export import export
from rp2040.reference import ReferenceModel, generate, val_losses
from rp2040.runtime import fixed
from rp2040.runtime.gpt import GPT
from tests.support.paths import REPO
from tests.support.rp2040_models import save_checkpoint


@pytest.fixture(scope="module")
def quality(tmp_path_factory):
    """rp2040-quality at a wide random init, exported int8 and f32."""
    d = tmp_path_factory.mktemp("ref")
    save_checkpoint("rp2040-quality", d / "ckpt", seed=3)
    export(d / "ckpt", d / "int8", "int8")
    export(d / "ckpt", d / "f32", "f32")
    return d


def test_exp_table_is_its_formula():
    assert fixed.EXP_TABLE == tuple(round(2 ** 15 * 2 ** (-i / 64)) for i in range(65))


def test_cpython_runtime_computes_the_reference_integers(quality):
    ref = ReferenceModel(quality / "int8" / "model.bin")
    ids = [84, 104, 101, 32, 99, 97, 116, 0, 255, 7]
    expected = ref.logits(ids)
    for stream in (False, True):
        g = GPT(str(quality / "int8" / "model.bin"), stream=stream)
        assert np.array_equal(np.array([list(g.forward(t, p)) for p, t in enumerate(ids)]), expected)
        g.close()


def test_val_loss_within_3_percent_of_pytorch_on_real_text(quality, shared_data):
    text = (shared_data / "tinystories" / "tinystories_val.txt").read_text(encoding="utf-8")[:4000]
    losses = val_losses(quality / "int8", text, max_tokens=2000)
    assert losses["tokens"] >= 1900
    assert abs(losses["int8 reference"] / losses["PyTorch f32"] - 1) < 0.03
    ref = ReferenceModel(quality / "int8" / "model.bin")
    ids = list(text.encode()[:64])
    from transformers import GPTNeoXForCausalLM
    with torch.no_grad():
        f32 = GPTNeoXForCausalLM.from_pretrained(quality / "ckpt").eval()(torch.tensor([ids])).logits[0].numpy()
    z = ref.logits(ids) / 2 ** 16
    assert (z.argmax(-1) == f32.argmax(-1)).mean() >= 0.9
    assert np.abs(z - f32).max() < 0.05 * np.abs(f32).max()


def test_sampling_is_seeded_and_respects_top_k(quality):
    ref = ReferenceModel(quality / "int8" / "model.bin")
    a = generate(ref, [72, 105], 12, 0.9, 5, seed=11)
    assert a == generate(ref, [72, 105], 12, 0.9, 5, seed=11) != generate(ref, [72, 105], 12, 0.9, 5, seed=12)
    for t, prefix in zip(a, [[72, 105] + a[:i] for i in range(len(a))]):
        logits = ref.logits(prefix)[-1]
        assert t in np.argsort(-logits)[:5]
    assert generate(ref, [72, 105], 6, 0.0, 0, 0) == generate(ref, [72, 105], 6, 1.0, 1, 99)  # both greedy


def test_cli_reports_both_losses_and_refuses_f32(quality, shared_data):
    val = shared_data / "tinystories" / "tinystories_val.txt"
    cli = [sys.executable, "-m", "rp2040.reference"]
    ok = subprocess.run(cli + [quality / "int8", "--text", val, "--max-tokens", "300"], capture_output=True,
                        text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    assert "int8 integer reference" in ok.stdout and "PyTorch f32" in ok.stdout
    bad = subprocess.run(cli + [quality / "f32", "--text", val], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"error: {quality / 'f32' / 'model.bin'} is an f32 export; the integer reference needs --dtype int8"]
