"""utils/run/allocation.py: what Slurm's and Kubernetes torch operators' variables decide, and how flags merge."""
import pytest

from utils.errors import PiconeoxError
from utils.run.allocation import PORT_BASE, detect, merge

NONE = dict(machines=None, rank=None, ip=None, port=None, gpus=None)
# srun --ntasks-per-node=1 on 2 nodes, as Slurm 22.05 sets it (seen on the test cluster), on the second node
STEP = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "1",
        "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[07-08]"}


def first_node(nodelist):
    assert nodelist == "gpu[07-08]"
    return "10.1.0.7"


def test_slurm_step_decides_machines_rank_address_port_and_gpus():
    found = detect({**STEP, "SLURM_GPUS_ON_NODE": "8"}, first_node)
    assert merge(found, **NONE) == dict(machines=2, rank=1, ip="10.1.0.7", port=PORT_BASE + 1234, gpus=8)
    # flags that agree are kept; an address or port of the user's replaces Slurm's proposal
    assert merge(found, machines=2, rank=1, ip="10.2.0.7", port=29500, gpus=8) == dict(
        machines=2, rank=1, ip="10.2.0.7", port=29500, gpus=8)


@pytest.mark.parametrize("key, value, allocated", [("machines", 3, 2), ("rank", 0, 1), ("gpus", 0, 8)])
def test_slurm_flag_that_contradicts_is_one_line(key, value, allocated):
    found = detect({**STEP, "SLURM_GPUS_PER_NODE": "h100:8"}, first_node)
    with pytest.raises(PiconeoxError) as e:
        merge(found, **{**NONE, key: value})
    flag = {"machines": "--num-machines", "rank": "--machine-rank", "gpus": "--gpus"}[key]
    assert str(e.value) == (f"{flag} {value} contradicts the Slurm allocation ({allocated}); drop {flag} or make "
                            f"it {allocated}")


def test_slurm_one_node_and_cpu_allocation():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_STEP_NUM_TASKS": "1", "SLURM_NODEID": "0"}
    assert merge(detect(env, first_node), **NONE) == dict(NONE, machines=1)  # no scontrol asked, GPUs left to torch
    env.pop("SLURM_STEP_ID")  # the batch script of a 1-node job may run the launcher itself
    assert merge(detect(env, first_node), **{**NONE, "gpus": 0}) == dict(NONE, machines=1, gpus=0)


def test_slurm_outside_a_step_or_several_tasks_per_node_refused():
    batch = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP")}
    with pytest.raises(PiconeoxError, match=r"Slurm job 1234 has 2 nodes .* `srun --ntasks-per-node=1`"):
        detect(batch, first_node)
    with pytest.raises(PiconeoxError, match="Slurm step runs 4 tasks on 2 node"):
        detect({**STEP, "SLURM_STEP_NUM_TASKS": "4"}, first_node)
    with pytest.raises(PiconeoxError, match="SLURM_NODEID='x' in the environment is not a whole number"):
        detect({**STEP, "SLURM_NODEID": "x"}, first_node)


def test_slurm_wins_over_variables_its_users_export():
    found = detect({**STEP, "MASTER_ADDR": "elsewhere", "WORLD_SIZE": "16", "RANK": "9"}, first_node)
    assert (found.source, found.machines, found.rank) == ("Slurm", 2, 1)


@pytest.mark.parametrize("env, rank", [
    # Kubeflow PyTorchJob, one launcher per pod: WORLD_SIZE pods, RANK the pod's index
    ({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "2"}, 2),
    # PyTorchJob with nprocPerNode (torchrun's PET_ variables; WORLD_SIZE counts processes there)
    ({"PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456", "PET_NNODES": "4", "PET_NODE_RANK": "3",
      "WORLD_SIZE": "32", "RANK": "0"}, 3),
    # JobSet / an indexed Job: the pod's completion index is its rank
    ({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "JOB_COMPLETION_INDEX": "1"}, 1),
])
def test_torch_operator_variables(env, rank):
    assert merge(detect(env), **NONE) == dict(machines=4, rank=rank, ip="job-master-0", port=23456, gpus=None)
    assert merge(detect(env), **{**NONE, "machines": 4, "rank": rank, "gpus": 8})["gpus"] == 8
    with pytest.raises(PiconeoxError, match="--main-process-port 29500 contradicts the Kubernetes allocation "
                                            "\\(23456\\)"):
        merge(detect(env), **{**NONE, "port": 29500})
    with pytest.raises(PiconeoxError, match="--machine-rank 0 contradicts"):
        merge(detect(env), **{**NONE, "rank": 0})


def test_torch_operator_edges():
    assert detect({}) is None and detect({"WORLD_SIZE": "2", "RANK": "1"}) is None  # no address: not a job
    one = detect({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "WORLD_SIZE": "1", "RANK": "0"})
    assert merge(one, **NONE) == dict(NONE, machines=1)
    assert detect({"MASTER_ADDR": "m", "WORLD_SIZE": "2", "RANK": "1"}).port == 29500
    with pytest.raises(PiconeoxError, match="WORLD_SIZE=2 but no machine rank in the environment"):
        detect({"MASTER_ADDR": "m", "WORLD_SIZE": "2"})
    with pytest.raises(PiconeoxError, match=r"RANK=2 is out of range for WORLD_SIZE=2 \(allowed 0..1\)"):
        detect({"MASTER_ADDR": "m", "WORLD_SIZE": "2", "RANK": "2"})
    with pytest.raises(PiconeoxError, match="WORLD_SIZE=0 in the environment: a job needs at least one machine"):
        detect({"MASTER_ADDR": "m", "WORLD_SIZE": "0"})
