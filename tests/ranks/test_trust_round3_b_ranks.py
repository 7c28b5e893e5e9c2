"""Issue 41 item 8: an FSDP2 resume where one rank's own file is refused ends on every rank with that rank's one
line; no rank waits in the sharded load for a rank that has gone (main: rank 0's gloo traceback came first)."""
import json
import os
import signal
import subprocess

from tests.conftest import REPO, TINY
from utils.ckpt.format import MARKER, manifest, write_marker


def start(tmp_path, data, *extra) -> subprocess.CompletedProcess:
    """./start_training.sh with FSDP2 over 2 gloo ranks; a run past 300 s is killed whole (a hang fails here)."""
    cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", "2", "--accelerate-config",
           str(REPO / "configs" / "accelerate" / "fsdp_production.yaml"), "--data", str(data), "--", *TINY,
           "--batch-size", "1", "--run-name", "run", "--output-dir", str(tmp_path / "ckpt"), "--log-dir",
           str(tmp_path / "logs"), "--eval-every", "4", "--sample-prompt", "", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PICONEOX_CPU_FSDP": "1"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"hung: {proc.communicate()[1][-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_one_ranks_refused_file_is_every_ranks_one_line(tmp_path, tiny_data):
    first = start(tmp_path, tiny_data, "--max-steps", "2", "--save-every", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    folder = tmp_path / "ckpt" / "run" / "step-00000002"
    rng = json.loads((folder / "rng-00001.json").read_text())
    (folder / "rng-00001.json").write_text(json.dumps({**rng, "torch": "00ff"}))  # only rank 1 reads it
    marker = json.loads((folder / MARKER).read_text())
    write_marker(folder, marker["step"], marker["world_size"], manifest(folder, sorted(marker["files"])))
    (tmp_path / "again").mkdir()
    resumed = start(tmp_path / "again", tiny_data, "--max-steps", "4", "--resume", str(folder))
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("error: ")]
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert errors and all("rank 1: " in e and "rng-00001.json: not an RNG state" in e for e in errors), errors
