"""EMA of the weights across ranks: resumed exactly under FSDP2 (2 gloo ranks) and after a kill -9 of 2 DDP ranks."""
import json
import random

import pytest
import torch

import train
from tests.support import chaos
from tests.support.ema_runs import EMA, assert_same_tensors, cut_from
from tests.support.ranks import TINY as DISTRIBUTED_TINY
from tests.support.ranks import launch
from utils.ckpt.format import step_dir_name
from utils.ckpt.load import read_weights

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")


def test_ema_resumes_exactly_on_two_fsdp2_ranks(tmp_path, tiny_data):
    """Each rank averages its own shard (DTensors with the parameters' placement) and DCP writes the shards. Cut
    at step 6 and resumed, step 12 is the uninterrupted one (DDP: the kill -9 test below); the EMA's val loss is
    the one process's (the evaluation really runs the averaged shards, the root's gathered weights included)."""
    fsdp = True
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    ref.mkdir()
    whole, _ = launch(ref, tiny_data, 2, 4, *EMA, fsdp=fsdp)
    cut_from(ref, cut, 6)
    resumed, proc = launch(cut, tiny_data, 2, 4, "--resume", "auto", *EMA, fsdp=fsdp)
    assert f"resumed from {cut / 'ckpt' / 'run' / step_dir_name(6)} at step 6" in proc.stderr
    assert resumed == whole
    assert "(FSDP2 fully_shard over 2 process(es))" in (cut / "logs" / "run" / "training.log").read_text()
    last = step_dir_name(12)
    a, b = ref / "ckpt" / "run" / last, cut / "ckpt" / "run" / last
    assert_same_tensors(read_weights(a, "ema"), read_weights(b, "ema"))
    assert_same_tensors(read_weights(a), read_weights(b))
    assert not torch.equal(read_weights(b, "ema")["gpt_neox.embed_in.weight"],
                           read_weights(b)["gpt_neox.embed_in.weight"])
    one = tmp_path / "one"  # the same global batch in one process, as test_distributed compares losses
    assert train.main(["--config", "test", "--data", str(tiny_data), *DISTRIBUTED_TINY, "--batch-size", "8",
                       "--run-name", "run", "--output-dir", str(one / "ckpt"), "--log-dir", str(one / "logs"),
                       *EMA]) == 0
    evals = [[(h["step"], h["val/loss"], h["val/loss_ema"]) for h in json.loads((d / "logs" / "run" /
             "history.json").read_text()) if "val/loss_ema" in h] for d in (cut, one)]
    assert [e[0] for e in evals[0]] == [e[0] for e in evals[1]] == [6, 12]
    assert [v for e in evals[0] for v in e[1:]] == pytest.approx([v for e in evals[1] for v in e[1:]], abs=1e-3)


def test_a_kill_9_on_two_ddp_ranks_resumes_to_identical_ema_weights(tmp_path, tiny_data):
    """benchmarks/chaos_lifecycle.py's machinery, one kill: 2 gloo DDP ranks (each writes its share of the EMA),
    the whole process tree SIGKILLed once a checkpoint of this attempt is complete, then --resume auto to the end:
    final/ (the EMA's weights) and the last step's EMA equal an uninterrupted run's."""
    steps, ref, work = 100, tmp_path / "ref", tmp_path / "work"
    ref.mkdir()
    work.mkdir()
    chaos.finish(ref, tiny_data, 2, steps, EMA)
    event = chaos.kill_attempt(work, chaos.launch(work, tiny_data, 2, steps, EMA), 2, "training", whole_tree=True,
                               rng=random.Random(0))
    assert event["hit"] in ("training", "save", "upload"), event  # killed after its first save, before the end
    chaos.finish(work, tiny_data, 2, steps, EMA)
    assert_same_tensors(chaos.final_weights(ref), chaos.final_weights(work))
    assert chaos.losses(ref) == chaos.losses(work)
    last = step_dir_name(steps)
    assert_same_tensors(read_weights(ref / "ckpt" / "r" / last, "ema"), read_weights(work / "ckpt" / "r" / last, "ema"))
