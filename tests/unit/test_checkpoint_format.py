"""The sharded checkpoint format: crc32c in the marker, same-size corruption caught everywhere, consolidation,
RNG states that resume on a box with another number of GPUs, and the staging buffers a save copies into."""
import json

import pytest
import torch

from tests.support.bounds import bound
from tests.support.training import LONG_RUN, run
from utils.ckpt import state as ckpt_state
from utils.ckpt.format import check_complete, read_marker
from utils.ckpt.state import rng_state

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")


def flip_a_byte(path) -> None:
    """Same size, different bytes: what a bad disk or a bit flip in transit leaves."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def trained(trained_long):
    """The session's 40-step run (complete step-10 to step-40, best/ and final/), its run folder and its losses."""
    history = json.loads((trained_long / "logs" / "run" / "history.json").read_text())
    return trained_long, trained_long / "ckpt" / "run", [h["train/loss"] for h in history if "train/loss" in h]


def test_marker_records_size_and_crc32c_of_every_file(trained):
    _, run_dir, _ = trained
    marker = read_marker(run_dir / "step-00000020")
    assert marker["step"] == 20 and marker["world_size"] == 1
    assert {"__0_0.distcp", ".metadata", "rng-00000.json", "config.json", "trainer.json"} <= set(marker["files"])
    assert all(set(info) == {"size", "crc32c"} for info in marker["files"].values())


def test_same_size_corruption_is_one_line_everywhere_and_auto_falls_back(trained, tiny_data, tmp_path, capsys):
    import shutil

    from rp2040.export import main as export_main
    from utils.consolidate import main as consolidate_main
    from utils.generate import main as generate_main

    out, run_dir, straight = trained
    work = tmp_path / "run"
    shutil.copytree(out / "ckpt", work / "ckpt")
    shutil.copytree(out / "logs", work / "logs")
    run_dir = work / "ckpt" / "run"
    flip_a_byte(run_dir / "step-00000020" / "__0_0.distcp")
    flip_a_byte(run_dir / "best" / "model.safetensors")
    capsys.readouterr()

    damaged = "does not match its crc32c (same size, different bytes)"
    for call in (lambda: run(work, tiny_data, "--max-steps", "40", "--resume", str(run_dir / "step-00000020"))[0],
                 lambda: generate_main([str(run_dir / "step-00000020"), "--max-new-tokens", "2"]),
                 lambda: generate_main([str(run_dir / "best"), "--max-new-tokens", "2"]),
                 lambda: export_main([str(run_dir / "best"), "--out", str(tmp_path / "pico")]),
                 lambda: consolidate_main([str(run_dir / "step-00000020"), "--out", str(tmp_path / "hf")])):
        assert call() == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and damaged in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "pico").exists() and not (tmp_path / "hf").exists()

    for newer in ("final", "step-00000040", "step-00000030"):  # the damaged step-20 is now the newest
        shutil.rmtree(run_dir / newer)
    code, losses, _ = run(work, tiny_data, *LONG_RUN, "--resume", "auto")
    log = (work / "logs" / "run" / "training.log").read_text()
    skipped = [line for line in log.splitlines() if "skipping checkpoint" in line]
    assert len(skipped) == 1 and "step-00000020" in skipped[0] and damaged in skipped[0]
    assert f"resumed from {run_dir / 'step-00000010'} at step 10" in log
    assert code == 0 and losses == straight  # the fallback resumed exactly


def test_consolidate_a_step_folder_for_from_pretrained(trained, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from utils.consolidate import main as consolidate_main

    _, run_dir, _ = trained
    assert consolidate_main([str(run_dir / "step-00000040"), "--out", str(tmp_path / "hf")]) == 0
    assert check_complete(tmp_path / "hf", verify=True) is None
    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final")  # consolidated by the run itself
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), final.state_dict().values()))
    assert consolidate_main([str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    assert consolidate_main([str(run_dir / "step-00000020"), "--out", str(run_dir / "step-00000020")]) == 2
    err = capsys.readouterr().err
    assert "no such checkpoint folder" in err and "must differ from the checkpoint folder" in err
    assert "Traceback" not in err


def test_gpu_rng_of_a_bigger_box_restores_on_a_smaller_one(monkeypatch):
    """Saved on GPU 5 of an 8-GPU box, resumed on a 1-GPU box: only this rank's own device state travels."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a GPU run: its model is on the GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.full((16,), 5, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.full((16,), i, dtype=torch.uint8)
                                                                 for i in range(8)])

    def set_rng_state(state, device="cuda"):
        index = 0 if device == "cuda" else torch.device(device).index
        if index >= torch.cuda.device_count():
            raise IndexError(f"no GPU {index} on this box")
        calls.append((index, int(state[0])))

    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all",
                        lambda states: [set_rng_state(s, f"cuda:{i}") for i, s in enumerate(states)])
    state = rng_state()
    ckpt_state.set_rng_state(state)
    assert calls == [(0, 5)]  # the saving rank's own GPU state, onto this rank's GPU


def test_a_grace_period_too_short_for_a_save_is_said_at_start_up(tmp_path, tiny_data):
    from utils.ckpt.state import grace_warning

    adamw = 12 * 1_414_647_808  # 1.2B: fp32 weights and AdamW's two moments
    assert grace_warning(adamw, 8, 30, bucket=True) is None  # on 8 ranks: 2.1 GB per rank fits
    assert "cannot hold a save of 16.98 GB per rank" in grace_warning(adamw, 1, 30, bucket=True)
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "1", "--grace-seconds", "0.0001",
                     "--checkpoint-bucket", str(tmp_path / "bucket"))
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    assert code == 0 and "--grace-seconds 0.0001 cannot hold a save of" in log
    assert "the bucket keeps the last checkpoint whose upload finished" in log


def test_staging_buffers_are_kept_for_the_run_and_never_overwrite_a_snapshot_still_being_written():
    """A save copies into the buffers of the previous one once that snapshot is written (no allocating and
    pinning the whole share at every save); while it is still being written, the new save gets its own."""
    stager = ckpt_state.Stager()
    weights = torch.zeros(1000)
    first = stager.stage({"model": {"w": weights}})
    kept = first["model"]["w"]  # its buffer, outliving the snapshot (only to see where the next save lands)
    del first  # written: the saver thread let it go
    weights += 1
    second = stager.stage({"model": {"w": weights}})
    assert second["model"]["w"].data_ptr() == kept.data_ptr() and kept[0] == 1  # the same buffer, refilled
    weights += 1
    third = stager.stage({"model": {"w": weights}})  # `second` is still being written
    assert third["model"]["w"].data_ptr() != kept.data_ptr()
    assert second["model"]["w"][0] == 1 and third["model"]["w"][0] == 2  # untouched by the newer save
    del second, third
    stager.stage({"model": {"w": weights}})
    assert len(stager._sets) == 1  # the extra set made while a write lagged is freed once idle


def test_saves_lagging_behind_hold_one_staging_set_and_a_second_while_a_write_lags(monkeypatch, tmp_path, tiny_data):
    """A save waits for the saver's slot BEFORE it captures (copies into staging buffers), so while
    writes lag there is the set being written and the one queued, never a third (at 1.2B on 8 GPUs a set is 2.1 GB
    of pinned memory per rank). Counted in the saver's own staging buffers, with a writer that waits for `go`."""
    import logging
    import threading

    from accelerate import Accelerator

    from configs.model import ModelConfig, build_model
    from configs.run import RunSettings
    from tests.support.waits import wait_for
    from utils.ckpt import saver
    from utils.ckpt.checkpointer import Checkpointer
    from utils.ckpt.uploader import CheckpointUploader
    from utils.data.tokenizers import load_tokenizer
    from utils.optim import build_optimizer, state_bytes

    stager = ckpt_state.Stager()  # this test's own, so earlier runs' sets do not count
    monkeypatch.setattr(ckpt_state, "_stager", stager)
    go, writing, write = threading.Event(), [], saver.write_shards

    def lagging_write(snap, folder, group=None):
        writing.append(folder.name)
        assert go.wait(bound(90)), "the test never let the write go on"
        return write(snap, folder, group)

    monkeypatch.setattr(saver, "write_shards", lagging_write)
    model = build_model(ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                                    max_position_embeddings=32, vocab_size=256))
    optimizer = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95))
    model(torch.zeros(1, 8, dtype=torch.long)).logits.sum().backward()
    optimizer.step()  # AdamW's moments exist: they are staged too
    uploader = CheckpointUploader(None, keep_local=5, progress=False)
    ckpt = Checkpointer(RunSettings(), tmp_path, uploader, best_and_final=False, accelerator=Accelerator(cpu=True),
                        metrics=None, log=logging.getLogger("piconeox"))
    ckpt.attach(model, optimizer, {}, run_config={}, tokenizer=load_tokenizer(tiny_data),
                optimizer_bytes=state_bytes(model, "adamw"))
    with ckpt:
        try:
            ckpt.save(1)
            wait_for("step 1 being written", lambda: writing == ["step-00000001"])
            ckpt.save(2)  # queued behind the lagging write: a second set
            assert len(stager._sets) == 2
            third = threading.Thread(target=ckpt.save, args=(3,))
            third.start()  # must wait for step 2 to leave the queue
            wait_for("save 3 waiting for the saver's slot", lambda: len(uploader._cond._waiters) == 1)
            assert len(stager._sets) == 2, "save 3 captured its state before waiting for the slot: a third set"
            go.set()
            third.join(bound(90))
            assert not third.is_alive()
            assert len(stager._sets) <= 2  # step 3 refilled step 1's set, written meanwhile (or step 2's)
            uploader.flush()
            ckpt.save(4)
            assert len(stager._sets) == 1  # every write done: the extra set is freed, one stays for the next save
            uploader.flush()
            assert [r.error for r in uploader.poll()] == [None] * 4
        finally:  # before the uploader flushes on the way out
            go.set()
    assert all(check_complete(ckpt.step_folder(step)) is None for step in range(1, 5))
