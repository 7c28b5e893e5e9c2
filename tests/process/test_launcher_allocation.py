"""start_training.sh inside a scheduler's job: the machine flags and --gpus come from the environment a Kubernetes
torch operator or Slurm sets (the real Slurm cluster: tests/slurm/), and a contradicting flag is one line."""
import os
import shlex
import subprocess

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO

SCHEDULER = ("SLURM_", "PET_", "MASTER_", "WORLD_SIZE", "RANK", "NODE_RANK", "JOB_COMPLETION_INDEX", "OMP_NUM_THREADS",
             "PICONEOX_FAKE_GPUS")
# Kubeflow PyTorchJob, one launcher per pod, the second of two pods
PYTORCHJOB = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}


def dry_run(env: dict, *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER)}
    return subprocess.run(["bash", str(REPO / "start_training.sh"), "--dry-run", "--config", "test", *args],
                          capture_output=True, text=True, env={**clean, **env}, timeout=bound(30))


def accelerate_flags(result: subprocess.CompletedProcess) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout.strip())
    return {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--") and i + 1 < len(words)}


def test_pytorchjob_variables_set_machines_rank_address_and_port():
    flags = accelerate_flags(dry_run(PYTORCHJOB, "--gpus", "0"))
    assert (flags["--num_machines"], flags["--machine_rank"], flags["--num_processes"]) == ("2", "1", "2")
    assert (flags["--main_process_ip"], flags["--main_process_port"]) == ("127.0.0.1", "23456")
    agreeing = accelerate_flags(dry_run(PYTORCHJOB, "--gpus", "0", "--num-machines", "2", "--machine-rank", "1"))
    assert agreeing == flags


@pytest.mark.parametrize("flag, value, allocated", [("--num-machines", "3", "2"), ("--machine-rank", "0", "1"),
                                                   ("--main-process-ip", "10.0.0.1", "127.0.0.1")])
def test_contradicting_flag_is_one_line_before_anything_starts(flag, value, allocated):
    result = dry_run(PYTORCHJOB, "--gpus", "0", flag, value)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"error: {flag} {value} contradicts the Kubernetes allocation ({allocated}); drop {flag} "
                             f"or make it {allocated}\n")


def test_slurm_allocation_sets_gpus_and_refuses_a_contradiction():
    # a 1-node job step with one GPU allocated on a box where torch sees two (PICONEOX_FAKE_GPUS)
    job = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_STEP_NUM_TASKS": "1", "SLURM_NODEID": "0", "SLURM_GPUS_ON_NODE": "1", "PICONEOX_FAKE_GPUS": "2"}
    flags = accelerate_flags(dry_run(job))
    assert flags["--num_processes"] == "1" and flags["--config_file"].endswith("single_gpu.yaml")
    result = dry_run(job, "--gpus", "2")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "error: --gpus 2 contradicts the Slurm allocation (1); drop --gpus or make it 1\n"
    batch = {k: v for k, v in job.items() if not k.startswith("SLURM_STEP")} | {"SLURM_JOB_NUM_NODES": "2"}
    result = dry_run(batch, "--gpus", "0")
    assert result.returncode == 2 and result.stderr.startswith("error: Slurm job 42 has 2 nodes but start_training.sh")
    assert len(result.stderr.splitlines()) == 1
