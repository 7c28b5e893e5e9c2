"""What a run writes, its resume accepts: one range for a setting and for the checkpoint that records it, and a
history that stays within what a resume reads. A run with a Muon learning rate above 10 trained, then its own
checkpoint was refused (scheduler.json's base_lrs past ranges.MAX_LR); a long run's history grew past the 16 MiB
a resume reads of metrics.json, and its own checkpoint was refused."""
import json

import pytest

from configs.training import TrainConfig
from tests.support.training import run
from utils.ckpt.load import read_part
from utils.ckpt.ranges import optimizer_problem, part_problem
from utils.errors import PiconeoxError
from utils.optim import MAX_LR
from utils.report.metrics import HISTORY_BYTES, MetricsWriter
from utils.textfile import MAX_JSON_BYTES

MUON = ("--set", "train.optimizer=muon", "--set", "train.lr_schedule=wsd")


@pytest.mark.parametrize("key", ["learning_rate", "muon_lr"])
def test_a_learning_rate_a_resume_would_refuse_is_refused_at_the_start(key):
    with pytest.raises(PiconeoxError, match=rf"train.{key}=10.5: .*<= {MAX_LR:g}"):
        TrainConfig(**{key: 10.5}).validate()
    TrainConfig(**{key: MAX_LR}).validate()  # the top of the range trains, and resumes (below)


@pytest.mark.usefixtures("fresh_accelerate_state", "one_thread")
def test_a_run_at_the_top_of_the_range_resumes_from_its_own_checkpoint(tmp_path, tiny_data):
    lr = ("--set", f"train.muon_lr={MAX_LR:g}", "--lr", f"{MAX_LR:g}",
          "--warmup-steps", "1", "--set", "train.decay_fraction=0.5")  # a 2-step wsd run that decays
    code, _, run_dir = run(tmp_path, tiny_data, "--max-steps", "2", "--save-every", "2", *MUON, *lr)
    assert code == 0
    scheduler = json.loads((run_dir / "step-00000002" / "scheduler.json").read_text())
    assert max(scheduler["base_lrs"]) == MAX_LR and part_problem("scheduler", scheduler, 2) is None
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "3", "--resume", str(run_dir / "step-00000002"), *MUON, *lr)
    assert code == 0


def test_the_optimizer_groups_learning_rates_obey_the_same_range():
    assert optimizer_problem({"param_groups": [{"lr": MAX_LR, "initial_lr": MAX_LR}]}) is None
    assert "optim.param_groups.1.initial_lr 10.5 is not a learning rate" in optimizer_problem(
        {"param_groups": [{"lr": 0.1}, {"lr": 0.1, "initial_lr": 10.5}]})


def test_a_long_runs_history_stays_within_what_its_resume_reads(tmp_path):
    """120,000 logged steps (~200 bytes each: 24 MB as it was) and an evaluation every 1,000."""
    writer = MetricsWriter(tmp_path / "logs", is_main=True, report_to=())
    steps = 120_000
    for step in range(1, steps + 1):
        writer.scalars(step, {"train/loss": 2.0 + 1 / step, "train/lr": 3e-4, "train/grad_norm": 0.5,
                              "train/step_time_s": 0.123456789, "train/tokens_per_s": 12345.678})
        if step % 1000 == 0:
            writer.scalars(step, {"val/loss": 2.5, "val/perplexity": 12.2, "val/best_loss": 2.5})
    state = writer.state_dict()
    (tmp_path / "metrics.json").write_text(json.dumps(state))
    assert HISTORY_BYTES / 2 < (tmp_path / "metrics.json").stat().st_size < MAX_JSON_BYTES
    loaded = read_part(tmp_path, "metrics", like=state)  # the reader a resume uses, with its cap
    assert part_problem("metrics", loaded, steps) is None
    history = loaded["history"]
    assert [h["step"] for h in history if "val/loss" in h] == list(range(1000, steps + 1, 1000))  # every eval
    assert history[-1]["step"] == steps and [h["step"] for h in history] == sorted(h["step"] for h in history)
    assert sum(h["step"] > steps // 2 for h in history if "train/loss" in h) > steps // 8  # the newer part is dense
