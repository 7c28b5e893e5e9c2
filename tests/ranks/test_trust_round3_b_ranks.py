"""Issue 41 item 8: an FSDP2 resume where one rank's own file is refused ends on every rank with that rank's one
line; no rank waits in the sharded load for a rank that has gone (main: rank 0's gloo traceback came first)."""
import json
import os

from tests.support.hostile_checkpoints import remark
from tests.support.paths import REPO
from tests.support.ranks import TINY, launch, run_bounded
from utils.ckpt.format import step_dir_name


def test_one_ranks_refused_file_is_every_ranks_one_line(tmp_path, tiny_data):
    launch(tmp_path, tiny_data, 2, 1, "--max-steps", "2", "--save-every", "2", "--eval-every", "2", fsdp=True)
    folder = tmp_path / "ckpt" / "run" / step_dir_name(2)
    rng = json.loads((folder / "rng-00001.json").read_text())
    (folder / "rng-00001.json").write_text(json.dumps({**rng, "torch": "00ff"}))  # only rank 1 reads it
    remark(folder)
    again = tmp_path / "again"
    again.mkdir()
    cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", "2", "--accelerate-config",
           str(REPO / "configs" / "accelerate" / "fsdp_production.yaml"), "--data", str(tiny_data), "--", *TINY,
           "--batch-size", "1", "--run-name", "run", "--output-dir", str(again / "ckpt"), "--log-dir",
           str(again / "logs"), "--max-steps", "4", "--resume", str(folder)]
    resumed = run_bounded(cmd, 300, cwd=again, env={**os.environ, "OMP_NUM_THREADS": "1", "PICONEOX_CPU_FSDP": "1"})
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("error: ")]
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert errors and all("rank 1: " in e and "rng-00001.json: not an RNG state" in e for e in errors), errors
