"""The sharded checkpoint format: crc32c in the marker, same-size corruption caught everywhere, consolidation,
and RNG states that resume on a box with another number of GPUs."""
import json

import pytest
import torch

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

    assert grace_warning(1_414_647_808, 8, 30, bucket=True) is None  # 1.2B on 8 ranks: 2.1 GB per rank fits
    assert "cannot hold a save of 16.98 GB per rank" in grace_warning(1_414_647_808, 1, 30, bucket=True)
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
