"""A resume that asks for another learning rate (AdamW's --lr, Muon's train.muon_lr) than its checkpoint trained at:
the checkpoint's rate and schedule continue, and one warning line in the log says so (it said nothing)."""
import json
import shutil

import pytest

from tests.support.training import reset_accelerate_state, run
from utils.optim import kept_rates

WARNING = "resume: the checkpoint's learning rate(s)"


def warnings(out) -> list[str]:
    return [line for line in (out / "logs" / "run" / "training.log").read_text().splitlines() if WARNING in line]


def peak_lr(out, after: int) -> float:
    history = json.loads((out / "logs" / "run" / "history.json").read_text())
    return max(r["train/lr"] for r in history if "train/lr" in r and r["step"] > after)


def test_a_new_adamw_rate_on_resume_is_one_warning_and_the_checkpoints_rate_continues(tmp_path, trained, tiny_data,
                                                                                     fresh_accelerate_state):
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    code, _, _ = run(tmp_path, tiny_data, "--resume", "auto", "--max-steps", "12", "--lr", "0.05")
    assert code == 0
    [line] = warnings(tmp_path)
    assert "0.003 continue, not the 0.05 this command asks for" in line, line
    assert peak_lr(tmp_path, after=10) <= 3e-3  # the checkpoint's schedule, not 0.05


def test_a_new_muon_rate_on_resume_is_one_warning(tmp_path, tiny_data, fresh_accelerate_state):
    muon = ("--set", "train.optimizer=muon", "--save-every", "2")
    assert run(tmp_path, tiny_data, *muon, "--max-steps", "2")[0] == 0
    reset_accelerate_state()
    assert run(tmp_path, tiny_data, *muon, "--max-steps", "4", "--resume", "auto", "--set", "train.muon_lr=0.5")[0] == 0
    [line] = warnings(tmp_path)
    assert "not the 0.003, 0.5 this command asks for" in line, line


@pytest.mark.parametrize("asked, restored, said", [([1e-3], [1e-3], None), ([3e-3, 0.02], [3e-3, 0.02], None),
                                                   ([0.05], [1e-3], "learning rate(s) 0.001 continue, not the 0.05")])
def test_kept_rates_speaks_only_of_a_difference(asked, restored, said):
    line = kept_rates(asked, restored)
    assert line is None if said is None else said in line
