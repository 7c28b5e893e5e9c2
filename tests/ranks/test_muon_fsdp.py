"""Muon under FSDP2 is refused in one line: each rank holds a shard (a DTensor) of every matrix, and Muon
orthogonalises whole matrices."""
import os

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.ranks import TINY, run_bounded


def test_muon_on_two_fsdp2_ranks_is_refused_in_one_line(tmp_path, tiny_data):
    cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", "2", "--accelerate-config",
           str(REPO / "configs" / "accelerate" / "fsdp_production.yaml"), "--data", str(tiny_data), "--", *TINY,
           "--batch-size", "4", "--run-name", "run", "--output-dir", str(tmp_path / "ckpt"), "--log-dir",
           str(tmp_path / "logs"), "--set", "train.optimizer=muon"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PICONEOX_CPU_FSDP": "1"}
    proc = run_bounded(cmd, bound(150), cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: train.optimizer=muon: not with FSDP2" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "ckpt" / "run").exists()  # refused before its first step: nothing of the run stays
