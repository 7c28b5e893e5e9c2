"""Host memory at scale, measured on 2 real FSDP2 ranks over gloo with a ~100M-parameter model (memory_probe.py)."""
import json
import os
import subprocess
import sys

from tests.conftest import REPO


def test_sharded_save_and_load_hold_no_full_state(tmp_path, tiny_data):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO / "configs" / "accelerate" / "fsdp_production.yaml"), "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
           str(REPO / "tests" / "memory_probe.py"), str(tmp_path), str(tiny_data)]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "PICONEOX_CPU_FSDP": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"rank"')),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1]
    rank0, rank1 = reports
    assert rank0["weights_mb"] > 350  # ~100M fp32 parameters
    # A save: rank 0 holds its own shard, not a gathered (and cloned) full state.
    assert rank0["save_mb"] < 1.5 * rank0["checkpoint_mb"]
    # No rank other than 0 ever holds the full optimizer state: not to save, not to resume.
    assert all(r["save_mb"] < r["optimizer_mb"] and r["load_mb"] < r["optimizer_mb"] for r in reports[1:])
    assert rank0["load_mb"] < rank0["optimizer_mb"]  # a resume reads shards in place, not torch.load of it all
    # Only rank 0 builds the fp32 weights; the others get their shards from it in prepare().
    assert rank1["build_mb"] < 0.1 * rank1["weights_mb"] < rank0["build_mb"]
