"""kill -9 of one node's processes in the middle of a save, on a real two-node Slurm job, then the same job requeued
(`scontrol requeue`, as Slurm requeues a preempted job or one whose node failed: the script's --requeue): it resumes
from the last complete step, never from the half-written one, and ends with an uninterrupted job's losses and final
weights; the surviving node says in one line that its peer is gone (no gloo traceback)."""
import contextlib
import os
import re
import signal
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.support.chaos import carry_on, pause
from tests.support.ema_runs import assert_same_tensors
from tests.support.slurm_jobs import JOB, complete_steps, finished, job_processes, losses, outputs, submit, wait_for
from utils.ckpt.format import MARKER, WEIGHTS_FILE, check_complete, step_folders

STEPS = 24
LINE = ("--max-steps", str(STEPS), "--save-every", "2", "--step-timeout-minutes", "0.5", "--resume", "auto")


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The shared working folder of this module's jobs, with the demo data the jobs' `--data demo` finds there."""
    from utils.data.prepare import prepare

    work = tmp_path_factory.mktemp("slurm-midsave")
    # here, on one worker: what this test is about starts after the data (and a job that prepares it with a pool
    # of forked workers has been seen to stall in the pool on this box)
    prepare(["demo"], name="demo-byte-p5", out_dir=work / "data", tokenizer="byte", workers=1, dataset_percent=5)
    return work


def in_flight(work: Path, run: str) -> list[Path]:
    """`run`'s step folders in the shared checkpoints folder that have no COMPLETE yet: saves under way."""
    return [folder for _, folder in step_folders(work / "checkpoints" / run) if not (folder / MARKER).is_file()]


def newest_complete(work: Path, run: str) -> int:
    """The newest step complete in the shared folder or in the bucket (where a resume may take it from)."""
    here = [step for step, folder in step_folders(work / "checkpoints" / run) if check_complete(folder) is None]
    return max(here + complete_steps(work, run), default=0)


def kill_node_mid_save(job: int, work: Path, run: str) -> tuple[list[Path], int]:
    """Once a checkpoint is complete, wait for a save in flight; with both nodes stopped, SIGKILL node 1's processes
    if it is still in flight (else let them go on and wait for the next). The folders half-written then, and the
    newest complete step."""
    wait_for(lambda: complete_steps(work, run), "the first complete checkpoint")
    while True:
        wait_for(lambda: in_flight(work, run), "a save in flight")
        nodes = [job_processes(job, node=0), job_processes(job, node=1)]
        pause(nodes[0] + nodes[1])
        if (saving := in_flight(work, run)) and nodes[1]:
            break
        carry_on(nodes[0] + nodes[1])
    newest = newest_complete(work, run)
    for pid in nodes[1]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    carry_on(nodes[0])
    return saving, newest


def node_output(work: Path, job: int, node: int) -> str:
    return next(work.glob(f"slurm-*-{job}.node{node}.out")).read_text(errors="replace")


def test_a_node_killed_mid_save_and_the_requeued_job_resumes_from_the_last_complete_step(slurm, work):
    ref = submit(slurm, work, "whole", *LINE)
    finished(slurm, work, ref)
    job = submit(slurm, work, "midsave", *LINE)
    half_written, newest = kill_node_mid_save(job, work, "midsave")
    assert slurm.wait_state(job, {"FAILED"}, JOB) == "FAILED", outputs(work, job)
    wait_for(lambda: not job_processes(job), "every process of the job to end")
    survivor = node_output(work, job, 0)
    assert "Traceback" not in survivor, survivor
    said = [line for line in survivor.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and "another process of the run is gone" in said[0], survivor
    assert "typically caused by" not in survivor, survivor  # the saves it cut short say so briefly, not in gloo's words
    for folder in half_written:  # nobody completed what node 1 never finished writing
        assert not (folder / MARKER).exists() and not (work / "bucket" / "midsave" / folder.name / MARKER).exists()
    assert newest_complete(work, "midsave") == newest

    before = node_output(work, job, 0)
    slurm.out(["scontrol", "requeue", str(job)])
    wait_for(lambda: slurm.job(job).get("JobState") != "FAILED", "the requeue")
    info = finished(slurm, work, job)
    assert info["Restarts"] == "1", info
    again = node_output(work, job, 0).removeprefix(before)
    resumed = re.findall(r"resumed from (\S+) at step (\d+) ", again)
    assert [int(step) for _, step in resumed] == [newest] and newest < min(int(f.name[5:]) for f in half_written), (
        resumed, half_written, again)
    assert complete_steps(work, "midsave")[-1] == STEPS
    assert all(check_complete(folder) is None for _, folder in step_folders(work / "checkpoints" / "midsave"))
    assert losses(work, "midsave") == losses(work, "whole")
    final = [load_file(work / "checkpoints" / run / "final" / WEIGHTS_FILE) for run in ("whole", "midsave")]
    assert_same_tensors(*final)
