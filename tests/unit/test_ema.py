"""EMA of the weights (train.ema_decay): one sharded checkpoint part, resumed exactly in one process
(tests/ranks/test_ema_ranks.py: under FSDP2 and after a kill -9); best/ and final/ can take its weights."""
import json

import pytest
import torch
from safetensors.torch import load_file

import train
from tests.support.ema_runs import EMA, assert_same_tensors, cut_from
from tests.support.training import run
from utils.ckpt.format import WEIGHTS_FILE, step_dir_name
from utils.ckpt.load import read_weights
from utils.ema import WeightEMA

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")
def test_the_average_moves_by_one_minus_decay_and_swaps_in_and_out():
    model = torch.nn.Linear(2, 2)
    ema = WeightEMA(model, 0.75)
    before = {k: v.clone() for k, v in ema.names.items()}
    with torch.no_grad():
        model.weight.add_(4.0)
    ema.update()
    assert torch.allclose(ema.names["weight"], before["weight"] + 1.0)  # (1 - 0.75) * 4
    saved = ema.state_dict()
    assert saved["weight"].data_ptr() != ema.names["weight"].data_ptr()  # a host copy, not the live average
    with ema.swapped_in():
        assert torch.equal(model.weight, ema.names["weight"])
    assert torch.equal(model.weight, before["weight"] + 4.0)


def test_ema_resumes_exactly_and_best_and_final_take_its_weights(tmp_path, tiny_data):
    common = ("--save-every", "6", "--eval-every", "6", *EMA)
    code, whole, ref = run(tmp_path / "ref", tiny_data, "--max-steps", "12", *common)
    assert code == 0
    cut_from(tmp_path / "ref", tmp_path / "cut", 6)
    code, rest, run_dir = run(tmp_path / "cut", tiny_data, "--max-steps", "12", "--resume", "auto", *common)
    assert code == 0 and rest == whole  # history carries the first half: every loss equal
    log = (tmp_path / "cut" / "logs" / "run" / "training.log").read_text()
    assert f"resumed from {run_dir / step_dir_name(6)} at step 6" in log
    last = step_dir_name(12)
    assert_same_tensors(read_weights(ref / last, "ema"), read_weights(run_dir / last, "ema"))
    assert_same_tensors(read_weights(ref / last), read_weights(run_dir / last))
    ema, raw = read_weights(run_dir / last, "ema"), read_weights(run_dir / last)
    final = load_file(run_dir / "final" / WEIGHTS_FILE)
    assert torch.equal(final["gpt_neox.embed_in.weight"], ema["gpt_neox.embed_in.weight"])
    assert not torch.equal(final["gpt_neox.embed_in.weight"], raw["gpt_neox.embed_in.weight"])
    from utils.consolidate import main as consolidate  # what a stop on a signal tells the user to run later

    assert consolidate([str(run_dir / last), "--out", str(tmp_path / "c"), "--weights", "ema"]) == 0
    assert_same_tensors(load_file(tmp_path / "c" / WEIGHTS_FILE), final)
    saved = json.loads((run_dir / "final" / "run_config.json").read_text())
    assert saved["train"]["best_final_weights"] == "ema" and saved["train"]["ema_decay"] == 0.9
    history = json.loads((tmp_path / "cut" / "logs" / "run" / "history.json").read_text())
    evals = [h for h in history if "val/loss_ema" in h]
    assert [h["step"] for h in evals] == [6, 12] and all(h["val/loss_ema"] != h["val/loss"] for h in evals)
    # best/ follows the EMA's val loss, and holds the EMA's weights of its step
    best = min(evals, key=lambda h: h["val/loss_ema"])["step"]
    assert torch.equal(load_file(run_dir / "best" / WEIGHTS_FILE)["gpt_neox.embed_in.weight"],
                       read_weights(run_dir / step_dir_name(best), "ema")["gpt_neox.embed_in.weight"])


def test_ema_on_a_checkpoint_trained_without_it_is_one_line(tmp_path, tiny_data, capsys):
    assert run(tmp_path, tiny_data, "--max-steps", "2", "--save-every", "2")[0] == 0
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "4", "--resume", "auto", "--set", "train.ema_decay=0.9")
    assert code == 2
    assert "the checkpoint has no ema state (it was trained without it)" in capsys.readouterr().err






@pytest.mark.parametrize("setting, line", [
    ("train.ema_decay=1.5", "error: train.ema_decay=1.5: must be in [0, 1), e.g. 0.999 (0 = no EMA)"),
    ("train.best_final_weights=ema", "error: train.best_final_weights='ema': allowed raw, or ema together with "
                                     "train.ema_decay (e.g. 0.999)")])
def test_bad_ema_settings_are_one_line(tmp_path, capsys, setting, line):
    assert train.main(["--config", "test", "--set", setting, "--output-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == line and not any(tmp_path.iterdir())
