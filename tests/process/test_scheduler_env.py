"""What a scheduler's variables (Slurm, Kubernetes torch jobs, torchrun leftovers) and the batch script can hold that
is wrong: each is one `error:` line naming the VARIABLE the user (or the scheduler) set, exit 2, no traceback, before
anything starts; Slurm and Kubernetes variables together are one warning line saying Slurm wins."""
import os
import subprocess

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO

SCHEDULER = ("SLURM_", "PET_", "MASTER_", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "JOB_COMPLETION_INDEX",
             "PICONEOX_", "GLOO_SOCKET_IFNAME")
STEP = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
POD = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}


def clean_env(**env: str) -> dict:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER)}, **env}


def start(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--dry-run",
                           *args], capture_output=True, text=True, env=clean_env(**env), timeout=bound(60))


def assert_one_line(result: subprocess.CompletedProcess, *words: str, code: int = 2) -> None:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == code and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and all(w in lines[0] for w in words), result.stderr


@pytest.mark.parametrize("env, words", [
    ({**STEP, "SLURM_JOB_NODELIST": ""}, ["SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are empty"]),
    ({**STEP, "SLURM_NODEID": "x"}, ["SLURM_NODEID='x'", "not a whole number"]),
    ({**STEP, "SLURM_NODEID": "7"}, ["SLURM_NODEID=7 is out of range", "0..1"]),
    ({**STEP, "SLURM_JOB_ID": "42949672960"}, ["SLURM_JOB_ID='42949672960'", "0 to 4294967295"]),
    ({**STEP, "SLURM_STEP_NUM_NODES": "-1"}, ["SLURM_STEP_NUM_NODES='-1'"]),
    ({**POD, "MASTER_PORT": "99999"}, ["MASTER_PORT='99999'", "1 to 65535"]),
    ({**POD, "MASTER_PORT": "0"}, ["MASTER_PORT='0'", "1 to 65535"]),
    ({**POD, "MASTER_PORT": "port"}, ["MASTER_PORT='port'"]),
    ({**POD, "PET_MASTER_PORT": "70000"}, ["PET_MASTER_PORT='70000'"]),
    ({**POD, "MASTER_ADDR": " "}, ["MASTER_ADDR=' '", "no address"]),
    ({**POD, "MASTER_ADDR": "10.0.0.1 "}, ["MASTER_ADDR='10.0.0.1 '"]),
    ({**POD, "MASTER_ADDR": "999.1.1.1"}, ["MASTER_ADDR='999.1.1.1' in the environment is not an IPv4 address"]),
    ({**POD, "RANK": "2"}, ["RANK=2 is out of range for WORLD_SIZE=2"]),
    ({**POD, "WORLD_SIZE": "0"}, ["WORLD_SIZE=0 in the environment"]),
])
def test_a_bad_scheduler_variable_is_one_line_naming_it(env, words):
    assert_one_line(start(env), *words)


def test_a_federated_slurm_job_id_of_ten_digits_is_a_job_id():
    # a federation's job ids sit above 2^26 (ten digits); the port still comes out in range
    result = start({**STEP, "SLURM_JOB_ID": "1234567890", "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_NUM_NODES": "1",
                    "SLURM_STEP_NUM_TASKS": "1"})
    assert result.returncode == 0 and "--num_machines 1" in result.stdout, result.stderr


def test_slurm_and_kubernetes_variables_together_say_that_slurm_wins():
    """A one-node Slurm job that also carries a pod's variables trained nothing: the one process took WORLD_SIZE=2
    RANK=0 to train.py and waited for a rank 1 forever."""
    result = start({"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "1", **POD, "RANK": "0"})
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert result.returncode == 0 and "--num_machines 1" in result.stdout, result.stderr
    assert len(warnings) == 1 and "the Slurm allocation wins" in warnings[0] and "MASTER_ADDR" in warnings[0]


@pytest.mark.parametrize("args, words", [
    (["--config", "tset"], ["unknown preset 'tset'"]),
    (["--", "--set", "train.lr=1"], ["unknown train setting 'lr'"]),
    (["--", "--sample-tokens", "100000000"], ["--sample-tokens 100000000: at most 1000"]),
    (["--rendezvous-timeout-seconds", "0"], ["--rendezvous-timeout-seconds '0' must be 1..604800"]),
    (["--", "--rendezvous-timeout-seconds", "-1"], ["--rendezvous-timeout-seconds -1"]),
])
def test_a_dry_run_refuses_what_the_run_would_refuse(args, words):
    assert_one_line(start({}, *args), *words)


@pytest.mark.parametrize("fsdp, words", [("  fsdp_version: 1\n", ["fsdp_version: 1", "FSDP2 only"]),
                                         ("  fsdp_offload_params: false\n", ["no fsdp_version", "FSDP2 only"])])
def test_an_fsdp1_accelerate_config_is_one_line(tmp_path, fsdp, words):
    config = tmp_path / "fsdp.yaml"
    config.write_text(f"distributed_type: FSDP\nmixed_precision: 'no'\nnum_processes: 2\nfsdp_config:\n{fsdp}")
    assert_one_line(start({}, "--procs", "2", "--accelerate-config", str(config)), *words)


def test_gloo_socket_ifname_with_a_trailing_space_is_one_line(tmp_path):
    result = subprocess.run([str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", "2",
                             "--data", "demo", "--max-steps", "1", "--", "--sample-tokens", "0"], cwd=tmp_path,
                            capture_output=True, text=True, env=clean_env(GLOO_SOCKET_IFNAME="lo "),
                            timeout=bound(180))
    assert_one_line(result, "GLOO_SOCKET_IFNAME='lo '", "spaces around a name")


def sbatch(tmp_path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "configs" / "slurm" / "train.sbatch"), "--config", "test"], cwd=tmp_path,
                          capture_output=True, text=True, env=clean_env(**env), timeout=bound(30))


def test_the_batch_script_outside_a_job_says_it_needs_sbatch(tmp_path):
    assert_one_line(sbatch(tmp_path), "SLURM_JOB_ID is unset", "submit it with sbatch")


def test_a_node_output_folder_that_does_not_exist_is_one_line_before_srun(tmp_path):
    result = sbatch(tmp_path, SLURM_JOB_ID="7", SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="n1",
                    PICONEOX_ROOT=str(REPO), PICONEOX_NODE_OUTPUT=str(tmp_path / "missing" / "node%n.out"))
    assert_one_line(result, "PICONEOX_NODE_OUTPUT=", "does not exist")
