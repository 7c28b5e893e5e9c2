"""HSDP over two simulated machines x 2 processes on CPU over gloo (PICONEOX_CPU_FSDP=1): each machine shards the
model in 2, the machines are replicas. One run is shared by the parity, timeout and resume tests; apart from
test_fsdp.py so that the two files' runs take two workers."""
import json

import pytest

from tests.support.ranks import launch, machines, relative_gap
from utils.ckpt.format import read_marker, step_dir_name


def losses_of(machine0) -> list[float]:
    history = json.loads((machine0 / "logs" / "run" / "history.json").read_text())
    return [r["train/loss"] for r in history if "train/loss" in r]


# HSDP in fp32 on 2 simulated machines x 2 processes: micro batch 1 x accumulation 2 on 4 ranks, the 8 blocks per step
# of 2 DDP ranks x accumulation 4. One run (step timeout 3 min) serves the three HSDP tests below.
HSDP = ["--mixed-precision", "no", "--max-steps", "16", "--save-every", "6", "--eval-every", "100"]


@pytest.fixture(scope="module")
def hsdp(tmp_path_factory, tiny_data):
    """The HSDP run over two machines: its folder (machine0/, machine1/ and the bucket with step 6)."""
    first = tmp_path_factory.mktemp("hsdp")
    machines(first, tiny_data, 2, *HSDP, "--step-timeout-minutes", "3")
    return first


def test_hsdp_gives_ddps_loss_at_every_step(hsdp, tiny_data, tmp_path):
    """Each machine shards the model in 2, the machines are replicas; the same loss as 2 DDP ranks
    at every logged step, not only at step 1 (before any update)."""
    ddp, _ = launch(tmp_path, tiny_data, 2, 1, "--grad-accum", "4", *HSDP)
    straight = losses_of(hsdp / "machine0")
    assert len(straight) == len(ddp) == 16
    # rank 0's weights reached both replicas: step 1 (before any update, the same 8 blocks) has DDP's loss
    assert straight[0] == pytest.approx(ddp[0], rel=1e-6)
    gaps = [abs(h - d) / d for h, d in zip(straight, ddp)]
    assert max(gaps) < 1e-5, gaps  # every step: the replicas' all-reduce and the shards' reduce-scatter agree
    assert ddp[-1] < ddp[0] - 0.5  # it learned: not two flat lines


def test_the_shard_and_replicate_groups_of_hsdp_get_the_step_timeout(hsdp):
    """FSDP2's shard and replicate groups, made by DeviceMesh with the backend's default timeout,
    get --step-timeout-minutes after the first step like every other group of the run; the timeouts line reads each
    group's timeout back from its backend (the groups found in each layer's FSDP state,
    `_fsdp_param_group.mesh_info`): 3 min, not gloo's default 30 (the savers keep --collective-timeout-minutes)."""
    log = (hsdp / "machine0" / "logs" / "run" / "training.log").read_text()
    assert ("collective timeout 3 min from step 2 on (FSDP2 shard group 3 min, FSDP2 replicate group 3 min, stop vote "
            "3 min, checkpoint savers 60 min)") in log, log[-3000:]


def test_hsdp_over_two_machines_resumes_on_one_and_on_two(tmp_path, tiny_data, hsdp):
    """2 machines x 2 processes: HSDP (each machine holds the model sharded in 2, the machines are replicas);
    its step 6 resumes on 1 machine (full shard over 2 ranks) and on 2 machines, with the uninterrupted losses."""
    log = (hsdp / "machine0" / "logs" / "run" / "training.log").read_text()
    assert "4 process(es) on cpu:0 (FSDP2 HSDP mesh: 2 replicas (machines) x 2 shards (processes per machine))" in log
    straight = losses_of(hsdp / "machine0")
    step6 = hsdp / "bucket" / "run" / step_dir_name(6)
    assert read_marker(step6)["world_size"] == 4
    for count in (1, 2):
        again = tmp_path / f"on{count}"
        machines(again, tiny_data, count, *HSDP, "--resume", str(step6))
        log = (again / "machine0" / "logs" / "run" / "training.log").read_text()
        assert f"resumed from {step6} at step 6" in log
        assert ("HSDP mesh: 2 replicas" in log) == (count == 2)
        assert relative_gap(losses_of(again / "machine0")[6:], straight[6:]) < 1e-5
