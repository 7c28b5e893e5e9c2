"""The machines a scheduler gave this job: read inside a Slurm job or a Kubernetes torch job, merged with the flags.

start_training.sh asks this module before anything starts. Inside a Slurm job step (one launcher per node:
configs/slurm/train.sbatch) the allocation fixes the number of machines (the step's nodes), this machine's rank
(SLURM_NODEID), the GPUs per machine (SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE) and the main address: the
first node's NodeAddr as `scontrol show node` gives it (a name that resolves to loopback is refused later by
utils/run/network.py, as for a typed --main-process-ip). The port is derived from the job id, so two jobs
sharing a node never collide. Kubernetes operators for torch jobs (Kubeflow PyTorchJob, JobSet) set
MASTER_ADDR/MASTER_PORT, the machine count (PET_NNODES, else WORLD_SIZE: pods, one launcher each) and the
machine's rank (PET_NODE_RANK, NODE_RANK, RANK, else the indexed job's JOB_COMPLETION_INDEX).

A flag the user passes wins when it agrees; one that contradicts the allocation is one `error:` line. Slurm only
proposes an address and a port: a --main-process-ip (another interface of the first node, say) or
--main-process-port replaces them.

    python -m utils.run.allocation MACHINES RANK IP PORT GPUS   # the flags ('' = not given); prints 5 lines
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from utils.errors import PiconeoxError, cli

BATCH_STEP = "4294967294"  # Slurm's id of the batch script's step (SLURM_BATCH_SCRIPT), where it sets one
MACHINE_ENV = "PICONEOX_MACHINE_RANK"  # exported by start_training.sh on multi-machine jobs
PORT_BASE, PORT_SPAN = 10000, 20000  # below Linux's ephemeral range (32768+), where outgoing connections live


@dataclass(frozen=True)
class Allocation:
    """What the scheduler decided; None where it says nothing. `source` names it in error lines."""
    source: str
    machines: int
    rank: int | None = None
    ip: str | None = None
    port: int | None = None
    gpus: int | None = None
    binding: tuple[str, ...] = ("machines", "rank", "gpus")  # the fields a contradicting flag may not override


HIGHEST = {"SLURM_JOB_ID": 2**32 - 1, "MASTER_PORT": 65535, "PET_MASTER_PORT": 65535}  # Slurm's job ids are 32-bit
LOWEST = {"MASTER_PORT": 1, "PET_MASTER_PORT": 1}  # (a federation's are ten digits); port 0 is "any", no meeting point


def _int(env: Mapping[str, str], name: str) -> int | None:
    """A whole number from the environment (None when unset or empty), or one line naming the variable."""
    value = env.get(name, "").strip()
    if value == "":
        return None
    low, high = LOWEST.get(name, 0), HIGHEST.get(name, 999_999_999)
    if not re.fullmatch(r"\d{1,19}", value) or not low <= int(value) <= high:
        raise PiconeoxError(f"{name}={env[name]!r} in the environment is not a whole number from {low} to {high}")
    return int(value)


def _first(env: Mapping[str, str], *names: str) -> tuple[str, int] | None:
    """(name, value) of the first of `names` that is set."""
    return next(((n, v) for n in names if (v := _int(env, n)) is not None), None)


def slurm_gpus(env: Mapping[str, str]) -> int | None:
    """GPUs per node in the allocation: SLURM_GPUS_ON_NODE (this node's), else SLURM_GPUS_PER_NODE ('8', 'h100:8')."""
    if (on_node := _int(env, "SLURM_GPUS_ON_NODE")) is not None:
        return on_node
    per_node = env.get("SLURM_GPUS_PER_NODE", "")
    if m := re.fullmatch(r"(?:[\w.-]+:)?(\d{1,6})", per_node):
        return int(m.group(1))
    return None


def scontrol_first_address(nodelist: str) -> str:
    """The first node of a Slurm node list ('n[1-2]') and its NodeAddr, through `scontrol`."""
    if not nodelist.strip():
        raise PiconeoxError("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are empty or unset in this Slurm job step: "
                            "no first node to meet at; run inside the job's step (srun) or pass --main-process-ip")
    def run(*args: str) -> str:
        try:
            done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PiconeoxError(f"cannot run `scontrol {' '.join(args)}` ({e}): pass --main-process-ip") from None
        if done.returncode != 0:
            raise PiconeoxError(f"`scontrol {' '.join(args)}` failed: {done.stderr.strip()[:200]}; "
                                "pass --main-process-ip") from None
        return done.stdout

    names = run("show", "hostnames", nodelist).split()
    if not names:
        raise PiconeoxError(f"SLURM_JOB_NODELIST={nodelist!r} names no node (`scontrol show hostnames` printed "
                            "nothing): pass --main-process-ip")
    first = names[0]
    addr = re.search(r"\bNodeAddr=(\S+)", run("show", "node", "-o", first))
    return addr.group(1) if addr else first


def from_slurm(env: Mapping[str, str], first_address: Callable[[str], str] = scontrol_first_address) -> Allocation:
    """The allocation of the Slurm job step this process runs in."""
    job = _int(env, "SLURM_JOB_ID")
    job_nodes = _first(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    nodes = job_nodes[1] if job_nodes else 1
    if env.get("SLURM_STEP_ID", BATCH_STEP) == BATCH_STEP:  # the batch script (or an salloc shell): the first node
        if nodes > 1:
            raise PiconeoxError(f"Slurm job {job} has {nodes} nodes but start_training.sh runs outside a job step (on "
                                "one node): start it with `srun --ntasks-per-node=1` (configs/slurm/train.sbatch does)")
        return Allocation("Slurm", 1, gpus=slurm_gpus(env))
    nodes = _int(env, "SLURM_STEP_NUM_NODES") or nodes
    tasks = _int(env, "SLURM_STEP_NUM_TASKS") or _int(env, "SLURM_NTASKS") or nodes
    if tasks != nodes:
        raise PiconeoxError(f"Slurm step runs {tasks} tasks on {nodes} node(s): start_training.sh must run once per "
                            "node (`srun --ntasks-per-node=1`, as configs/slurm/train.sbatch does); it starts one "
                            "process per GPU itself")
    rank = _int(env, "SLURM_NODEID") or 0
    if rank >= nodes:
        raise PiconeoxError(f"SLURM_NODEID={rank} is out of range for a step of {nodes} node(s) (allowed "
                            f"0..{nodes - 1})")
    ip = first_address(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")) if nodes > 1 else None
    port = PORT_BASE + (job or 0) % PORT_SPAN if nodes > 1 else None
    return Allocation("Slurm", nodes, rank, ip, port, slurm_gpus(env))


def operator_variable(env: Mapping[str, str]) -> str | None:
    """The variable that names the main machine's address in a Kubernetes torch job (PET_MASTER_ADDR, else
    MASTER_ADDR); None outside one. A DNS name there may resolve only once that pod is up."""
    return next((name for name in ("PET_MASTER_ADDR", "MASTER_ADDR") if env.get(name)), None)


def from_torch_operator(env: Mapping[str, str]) -> Allocation | None:
    """What a Kubernetes torch job's variables say; None when they are not set."""
    addr_name = operator_variable(env)
    count = _first(env, "PET_NNODES", "WORLD_SIZE")
    if addr_name is None or count is None:
        return None
    addr = env[addr_name]
    if not addr.strip() or addr != addr.strip():
        raise PiconeoxError(f"{addr_name}={addr!r} in the environment is no address (blank, or spaces around it): "
                            "set machine 0's address, e.g. 10.0.0.1")
    name, machines = count
    rank = _first(env, "PET_NODE_RANK", "NODE_RANK", "RANK", "JOB_COMPLETION_INDEX")
    if machines < 1:
        raise PiconeoxError(f"{name}={machines} in the environment: a job needs at least one machine")
    if machines > 1 and rank is None:
        raise PiconeoxError(f"{name}={machines} but no machine rank in the environment (PET_NODE_RANK, NODE_RANK, "
                            "RANK or JOB_COMPLETION_INDEX): pass --machine-rank")
    if rank is not None and rank[1] >= machines:
        raise PiconeoxError(f"{rank[0]}={rank[1]} is out of range for {name}={machines} (allowed 0..{machines - 1})")
    if machines == 1:
        return Allocation("Kubernetes", 1, binding=("machines",))
    port = _first(env, "PET_MASTER_PORT", "MASTER_PORT")
    return Allocation("Kubernetes", machines, rank[1], addr, port[1] if port else 29500,
                      binding=("machines", "rank", "ip", "port"))


TORCH_GROUP_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "PET_MASTER_ADDR",
                    "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK")


def detect(env: Mapping[str, str], first_address: Callable[[str], str] = scontrol_first_address) -> Allocation | None:
    """The scheduler's allocation, Slurm first (its users often export MASTER_ADDR themselves); None outside one.
    With both, one line says that Slurm's wins: start_training.sh then launches without the torch variables, which
    a one-process launch would hand to train.py as a group to wait for."""
    if env.get("SLURM_JOB_ID"):
        found = from_slurm(env, first_address)
        if also := [name for name in TORCH_GROUP_VARS if env.get(name)]:
            print(f"warning: Slurm job {env['SLURM_JOB_ID']} and {', '.join(also)} in the environment: the Slurm "
                  f"allocation wins ({found.machines} machine(s)); the torch job variables are ignored",
                  file=sys.stderr)
        return found
    return from_torch_operator(env)


def machine_folder(root: str | os.PathLike, env: Mapping[str, str] = os.environ) -> Path:
    """`root/<this machine's name>`: machines sharing a filesystem (NFS, a shared home) each keep their own cache
    (datasets and checkpoints from a bucket), so one machine's cleanup of stale `.partial` files never deletes
    another's download in flight. Nodes of one job that share a hostname (several slurmd on one host, containers)
    are told apart by their Slurm node name (stable across jobs), else by the machine rank start_training.sh
    exports."""
    name = socket.gethostname()
    node = env.get("SLURMD_NODENAME") or (f"machine-{env[MACHINE_ENV]}" if env.get(MACHINE_ENV) else "")
    if node and node != name.split(".")[0]:
        name = f"{name}.{node}"
    return Path(root) / (re.sub(r"[^A-Za-z0-9._-]", "_", name) or "host")


def slurm_time_left(text: str) -> float | None:
    """Seconds in squeue's `%L` (`[days-][hours:]minutes:seconds`); None for UNLIMITED, NOT_SET or anything else."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def slurm_seconds_left(env: Mapping[str, str]) -> float | None:
    """Seconds until this Slurm job's time limit (`squeue -h -j JOB -o %L`, which follows a changed limit; else
    SLURM_JOB_END_TIME); None outside a job, for a job without a limit, or when neither answers."""
    job = env.get("SLURM_JOB_ID", "")
    if not re.fullmatch(r"\d{1,12}", job):
        return None
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True, timeout=30)
        if done.returncode == 0 and (left := slurm_time_left(done.stdout)) is not None:
            return left
    except (OSError, subprocess.TimeoutExpired):
        pass
    end = env.get("SLURM_JOB_END_TIME", "")
    return float(end) - time.time() if re.fullmatch(r"\d{9,12}", end) else None


FLAGS = {"machines": "--num-machines", "rank": "--machine-rank", "ip": "--main-process-ip",
         "port": "--main-process-port", "gpus": "--gpus"}


def merge(found: Allocation | None, **flags: str | int | None) -> dict[str, str | int | None]:
    """The flags (None = not given) completed by the allocation; a given flag that contradicts it raises."""
    if found is None:
        return flags
    merged = dict(flags)
    for key, given in flags.items():
        decided = getattr(found, key)
        if decided is None:
            continue
        if given is None:
            merged[key] = decided
        elif str(given) != str(decided) and key in found.binding:
            raise PiconeoxError(f"{FLAGS[key]} {given} contradicts the {found.source} allocation ({decided}); "
                                f"drop {FLAGS[key]} or make it {decided}")
    if merged["machines"] == 1:  # one machine: no rank or address to pass
        merged.update(rank=flags["rank"], ip=flags["ip"], port=flags["port"])
    return merged


@cli
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != len(FLAGS):
        print("usage: python -m utils.run.allocation MACHINES RANK IP PORT GPUS ('' for a flag not given)",
              file=sys.stderr)
        return 2
    flags = {k: (v if v != "" else None) for k, v in zip(FLAGS, argv)}
    for key, value in flags.items():
        if value is not None and key != "ip":
            flags[key] = int(value)  # start_training.sh checked them
    merged = merge(detect(os.environ), **flags)
    print("\n".join("" if merged[k] is None else str(merged[k]) for k in FLAGS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
