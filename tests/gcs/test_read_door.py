"""utils/ckpt/read.py, the read door every reader of a checkpoint goes through: a run folder, a step folder, an HF
folder and a bucket URL (gs:// on the emulator, s3:// on moto's server) each give the
model and tokenizer of the checkpoint they name; a bucket's newest complete step is the one read."""
from __future__ import annotations

import shutil

import pytest
import torch

from utils.ckpt.read import CHECKPOINT_CACHE, MARKER, locate, open_checkpoint
from utils.errors import PiconeoxError
from utils.storage import open_storage
from utils.storage.sync import upload_tree


def same_model(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_run_a_step_and_an_hf_folder_give_their_checkpoints_model(trained, tmp_path):
    run_dir = trained / "ckpt" / "run"
    step_model, step_tok = open_checkpoint(run_dir / "step-00000010")
    best_model, _ = open_checkpoint(run_dir)  # a run folder: its best/
    assert same_model(best_model, open_checkpoint(run_dir / "best")[0])
    hf = tmp_path / "hf"
    step_model.save_pretrained(hf)
    step_tok.save_pretrained(hf)
    hf_model, hf_tok = open_checkpoint(hf)  # no marker: what from_pretrained reads
    assert same_model(hf_model, step_model) and hf_tok.get_vocab() == step_tok.get_vocab()
    with pytest.raises(PiconeoxError, match="^--checkpoint .*: no such checkpoint folder"):
        locate(tmp_path / "nowhere", flag="--checkpoint ")


@pytest.fixture(params=["gcs_emulator", "s3_server"])
def remote(request):
    """A bucket on a real server on 127.0.0.1: gs:// on the emulator, s3:// on moto's server."""
    return request.getfixturevalue(request.param)


def test_a_bucket_url_gives_its_newest_complete_step(trained, remote, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the cache lands in ./checkpoints/bucket-cache
    step = trained / "ckpt" / "run" / "step-00000010"
    store = open_storage(remote.url("ckpt/run"))
    upload_tree(step, store.child(step.name), last=MARKER, progress=False)
    unfinished = tmp_path / "step-00000020"
    shutil.copytree(step, unfinished)
    (unfinished / MARKER).unlink()  # an upload cut short: never chosen
    upload_tree(unfinished, store.child(unfinished.name), last=None, progress=False)

    model, tokenizer = open_checkpoint(remote.url("ckpt/run"))
    local_model, local_tok = open_checkpoint(step)
    assert same_model(model, local_model) and tokenizer.get_vocab() == local_tok.get_vocab()
    folder = locate(remote.url("ckpt/run/step-00000010"))
    assert folder.name == "step-00000010" and folder.resolve().is_relative_to((tmp_path / CHECKPOINT_CACHE).resolve())
    with pytest.raises(PiconeoxError, match="step-00000020: no COMPLETE marker there"):
        locate(remote.url("ckpt/run/step-00000020"))
