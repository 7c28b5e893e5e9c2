"""Jobs of configs/slurm/train.sbatch on the test cluster (tests/support/slurm.py) for tests/slurm/: how one is
submitted (the test preset, a tiny model, on CPU), what it wrote (its outputs, the bucket's complete steps, the
losses) and which processes are its own.

Both nodes run on this host and share one working folder (data/, checkpoints/, logs/), as cluster nodes share NFS.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from tests.support.bounds import bound
from tests.support.paths import REPO

SBATCH = REPO / "configs" / "slurm" / "train.sbatch"
# A tiny model, a few steps: the scheduler's part is what these tests check
TINY = ["--set", "model.num_layers=1", "--set", "model.hidden_size=32", "--set", "model.num_heads=4", "--set",
        "model.intermediate_size=64", "--seq-len", "32", "--batch-size", "4", "--log-every", "1", "--warmup-steps",
        "2", "--lr", "3e-3", "--eval-every", "1000", "--eval-batches", "1", "--keep-last", "100", "--dataset-percent",
        "5", "--grace-seconds", "45"]  # below the test cluster's KillWait (60 s)
JOB = bound(150)  # s: bounds that only catch a hang (a job here takes well under a minute on an idle 2-core box)


def submit(slurm, work: Path, run: str, *extra: str, nodes: int = 2, launcher: tuple = ()) -> int:
    return slurm.sbatch([f"--nodes={nodes}", f"--chdir={work}", str(SBATCH), "--config", "test", "--gpus", "0",
                         "--data", "demo", *launcher, "--", *TINY, "--run-name", run, "--checkpoint-bucket",
                         str(work / "bucket"), *extra], cwd=REPO)


def outputs(work: Path, job: int) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(work.glob(f"slurm-*-{job}*.out")))


def complete_steps(work: Path, run: str) -> list[int]:
    """The bucket's complete checkpoints of `run` (a step counts once its COMPLETE marker exists)."""
    return sorted(int(p.parent.name.removeprefix("step-")) for p in (work / "bucket" / run).glob("step-*/COMPLETE"))


def losses(work: Path, run: str) -> dict[int, float]:
    rows = json.loads((work / "logs" / run / "history.json").read_text())
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def wait_for(condition, what: str, timeout: float = JOB):
    end = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > end:
            raise TimeoutError(f"{what} not within {timeout} s")
        time.sleep(0.2)
    return found


def finished(slurm, work: Path, job: int, state: str = "COMPLETED") -> dict:
    got = slurm.wait_state(job, {state}, JOB)
    info = slurm.job(job)
    assert got == state, f"job {job} {got} ({info.get('ExitCode')}), wanted {state}:\n{outputs(work, job)}"
    assert "Traceback" not in outputs(work, job), outputs(work, job)
    return info


def job_processes(job: int, node: int | None = None) -> list[int]:
    """Pids of the job's step processes (the launcher and everything under it), by the environment Slurm gave them."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            env = dict(v.split("=", 1) for v in environ.read_bytes().decode(errors="replace").split("\0") if "=" in v)
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == str(job) and "SLURM_STEP_ID" in env and env.get("SLURMD_NODENAME") and (
                node is None or env.get("SLURM_NODEID") == str(node)):
            found.append(int(environ.parent.name))
    return found
