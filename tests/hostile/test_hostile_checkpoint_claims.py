"""A checkpoint that claims what its files do not hold: JSON bigger than its kind needs, numbers a resume would obey
without a range, a marker's step that is no number, weights the index names but the folder lacks. Each test failed on
main 0a6935d before its check existed (what it saw then is in its docstring).
"""
import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import assert_error_line
from tests.support.hostile_checkpoints import remark
from tests.support.training import run
from utils.ckpt.format import MARKER, read_marker
from utils.errors import PiconeoxError

STEP = "step-00000010"


def test_json_costs_what_its_kind_needs(tmp_path, trained):
    """main: a 2 MiB COMPLETE marker (or config.json) was parsed: every JSON file could be 64 MiB (1.8 GB parsed)."""
    folder = Path(shutil.copytree(trained / "ckpt" / "run" / STEP, tmp_path / STEP))
    (folder / MARKER).write_text((folder / MARKER).read_text() + " " * (2 << 20))
    assert read_marker(folder) is None


def resume_line(tmp_path, data, folder: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = run(tmp_path, data, "--max-steps", "12", "--resume", str(folder))[0]
    return code, err.getvalue()


@pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")
@pytest.mark.parametrize("file, change, words", [
    ("scheduler.json", lambda d: d.update(last_epoch=-10**8), "last_epoch -100000000, but the checkpoint is at step"),
    ("scheduler.json", lambda d: d.update(base_lrs=[1e308] * len(d["base_lrs"])), "are not learning rates"),
    ("scheduler.json", lambda d: d.update(last_epoch=None), "last_epoch: null where number belongs"),
    ("trainer.json", lambda d: d.update(step=-1000), "step -1000, but the COMPLETE marker says step 10"),
    ("run_config.json", lambda d: d["train"].update(global_batch_tokens=10**9), "train.global_batch_tokens"),
    ("metrics.json", lambda d: d["history"][0].update(step=None), "history entry's step"),
    ("trainer.json", "{\"step\": " + "1" * 5000 + "}", "a number there is too long to read")])
def test_every_number_a_resume_obeys_is_checked(tmp_path, trained, tiny_data, file, change, words):
    """main: trained at lr -1e4, saved non-finite weights, ran 1,012 steps into step--0000968, built a batch of a
    million micro-batches, or ended in a traceback."""
    folder = Path(shutil.copytree(trained / "ckpt" / "run" / STEP, tmp_path / "from" / STEP))
    if isinstance(change, str):
        (folder / file).write_text(change)
    else:
        state = json.loads((folder / file).read_text())
        change(state)
        (folder / file).write_text(json.dumps(state))
    remark(folder)
    code, err = resume_line(tmp_path, tiny_data, folder)
    assert code == 2, err[-3000:]
    assert_error_line(err, file, words)
    assert not (tmp_path / "ckpt" / "run").exists() or not any((tmp_path / "ckpt" / "run").glob("step-*"))


def test_a_marker_whose_step_is_not_a_number_is_unreadable(tmp_path, trained):
    """main: `"step": "abc"` was a ValueError traceback on resume, and consolidate copied it."""
    folder = Path(shutil.copytree(trained / "ckpt" / "run" / STEP, tmp_path / STEP))
    marker = json.loads((folder / MARKER).read_text())
    for step in ("abc", None, -1, 10.0, 11):
        (folder / MARKER).write_text(json.dumps({**marker, "step": step}))
        from utils.ckpt.format import check_complete
        assert "COMPLETE" in check_complete(folder), step


def test_weights_the_index_names_but_the_folder_lacks_are_refused(tmp_path, trained):
    """main: the config-vs-weights check skipped, and a 4-layer config over 1 layer loaded 3 random layers."""
    from utils.ckpt.hf.hf_folder import checked_config

    folder = Path(shutil.copytree(trained / "ckpt" / "run" / "best", tmp_path / "best"))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"gpt_neox.embed_in.weight": "model-00002-of-00002.safetensors"}}))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))
    with pytest.raises(PiconeoxError, match="names 'model-00002-of-00002.safetensors', which is not a file"):
        checked_config(folder)
