"""HSDP against DDP at every step (issue 42, item 10): 2 simulated machines x 2 processes (each machine shards the
model in 2, the machines are replicas) train the same 8 blocks per step as 2 DDP ranks, and give the same loss at
every logged step, not only at step 1 (before any update)."""
import json

from tests.support.ranks import launch, machines

STEPS = ["--max-steps", "16", "--save-every", "100", "--eval-every", "100", "--mixed-precision", "no"]


def test_hsdp_gives_ddps_loss_at_every_step(tmp_path, tiny_data):
    (tmp_path / "ddp").mkdir()
    ddp, _ = launch(tmp_path / "ddp", tiny_data, 2, 1, "--grad-accum", "4", *STEPS)
    machines(tmp_path / "hsdp", tiny_data, 2, *STEPS)
    history = json.loads((tmp_path / "hsdp" / "machine0" / "logs" / "run" / "history.json").read_text())
    hsdp = [r["train/loss"] for r in history if "train/loss" in r]
    assert len(hsdp) == len(ddp) == 16
    gaps = [abs(h - d) / d for h, d in zip(hsdp, ddp)]
    assert max(gaps) < 1e-5, gaps  # every step: the replicas' all-reduce and the shards' reduce-scatter agree
    assert ddp[-1] < ddp[0] - 0.5  # it learned: not two flat lines
