"""--init-from: fine-tune a GPT-NeoX checkpoint in Hugging Face format (weights, tokenizer and shape from it)."""
import json
import math
import shutil

import pytest
import torch

import train
from prepare_data import main as prepare_main
from tests.support.training import TINY, run
from utils.data.loader import BlockLoader
from utils.data.prepare import prepare
from utils.data.shards import read_manifest
from utils.data.tokenizers import file_sha256

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    """Our own run of 40 steps (val loss ~3.3, far below ln(256) = 5.5): its run directory."""
    from accelerate.state import AcceleratorState, GradientState

    tmp = tmp_path_factory.mktemp("source")
    code, _, run_dir = run(tmp, tiny_data, "--max-steps", "40", "--eval-every", "40", "--sample-prompt", "")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    assert code == 0
    return run_dir


@pytest.fixture(scope="module")
def pythia_like(trained, tmp_path_factory):
    """What a user downloads: save_pretrained weights (vocab padded 256 -> 320 like Pythia's) and tokenizer only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("pythia-like")
    model = AutoModelForCausalLM.from_pretrained(trained / "final")
    model.resize_token_embeddings(320, mean_resizing=False)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(trained / "final").save_pretrained(folder)
    return folder


def loss_on_first_batch(folder, data_dir) -> float:
    """The source model's loss on the batch a run with TINY's seed, seq_len and batch trains on first."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    x, y = next(iter(BlockLoader(data_dir, "train", 32, 4, seed=1337)))
    with torch.no_grad():
        logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1)).item()


def test_fine_tuning_starts_at_the_source_models_loss(tmp_path, pythia_like):
    data = prepare(["demo"], name="demo-pythia-like", out_dir=tmp_path / "data", dataset_percent=5,
                   tokenizer_from=str(pythia_like))
    assert read_manifest(data).tokenizer_sha256 == file_sha256(pythia_like / "tokenizer.json")
    expected = loss_on_first_batch(pythia_like, data)

    code, losses, run_dir = run(tmp_path, data, "--max-steps", "3", "--init-from", str(pythia_like))
    assert code == 0
    assert losses[0] == pytest.approx(expected, abs=1e-4)
    assert losses[0] < math.log(320) - 1.5  # a fresh model starts at ~ln(vocab) = 5.8
    saved = json.loads((run_dir / "final" / "run_config.json").read_text())
    assert saved["model"]["vocab_size"] == 320 and saved["init_from"] == str(pythia_like)
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    assert "model shape from its config.json (hidden 32, 1 layers, 4 heads, intermediate 64" in log
    assert "not the preset's model section" in log


@pytest.mark.parametrize("folder", ["final", "step-00000040"])
def test_our_own_checkpoint_continues_on_its_original_data(tmp_path, trained, tiny_data, folder):
    """final/ (consolidated) or a sharded step folder; save_pretrained rewrote tokenizer.json, so the data is
    recognised by the dataset hash in run_config.json."""
    expected = loss_on_first_batch(trained / "final", tiny_data)
    code, losses, _ = run(tmp_path, tiny_data, "--max-steps", "1", "--init-from", str(trained / folder))
    assert code == 0 and losses[0] == pytest.approx(expected, abs=1e-4)


def bad_folder(kind, pythia_like, tmp_path):
    folder = tmp_path / kind
    shutil.copytree(pythia_like, folder)
    config = json.loads((folder / "config.json").read_text())
    if kind == "llama":
        config["model_type"] = "llama"
    if kind == "small-vocab":
        config["vocab_size"] = 100
    if kind == "other-activation":
        config["hidden_act"] = "relu"
    (folder / "config.json").write_text(json.dumps(config))
    if kind == "no-tokenizer":
        (folder / "tokenizer.json").unlink()
    if kind == "no-weights":
        (folder / "model.safetensors").unlink()
    return folder


@pytest.mark.parametrize("kind,message", [
    ("missing", "no such folder"),
    ("llama", "model_type 'llama' is not GPT-NeoX"),
    ("small-vocab", "vocab mismatch: the tokenizer has 256 ids but the model's embedding has 100 rows"),
    ("other-activation", "config.json has hidden_act='relu'; piconeox's GPT-NeoX needs 'gelu'"),
    ("no-tokenizer", "no tokenizer.json; the checkpoint's tokenizer must be next to its weights"),
    ("no-weights", "no weights; expected one of model.safetensors"),
    ("other-data", "was tokenized with another tokenizer"),
])
def test_bad_init_from_is_one_line(tmp_path, tiny_data, pythia_like, capsys, kind, message):
    folder = ({"missing": tmp_path / "nope", "other-data": pythia_like}.get(kind)
              or bad_folder(kind, pythia_like, tmp_path))
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "1", "--init-from", str(folder))
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: --init-from") and message in err and len(err.splitlines()) == 1
    assert train.main([*TINY, "--data", str(tiny_data), "--init-from", str(folder), "--preflight"]) == 2  # caught early


def test_prepare_data_tokenizer_from_bad_input(tmp_path, pythia_like, capsys):
    assert prepare_main(["demo", "--tokenizer-from", str(tmp_path / "nope"), "--out-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: --tokenizer-from {tmp_path / 'nope'}: no tokenizer.json there " \
                                              "(give a checkpoint folder holding one, or the file)"
    with pytest.raises(SystemExit) as exit_info:
        prepare_main(["demo", "--tokenizer-from", str(pythia_like), "--tokenizer", "char"])
    assert exit_info.value.code == 2 and "--tokenizer-from replaces --tokenizer" in capsys.readouterr().err
    data = prepare(["demo"], name="d", out_dir=tmp_path, dataset_percent=5, tokenizer="char")
    with pytest.raises(train.PiconeoxError, match="holds another tokenizer"):
        prepare(["demo"], name="d", out_dir=tmp_path, dataset_percent=5, tokenizer_from=str(pythia_like))
    assert read_manifest(data).options["tokenizer"] == "char"  # the failed run changed nothing
