"""configs/slurm/train.sbatch on a real two-node Slurm cluster (tests/support/slurm.py): CPU jobs of the test preset
that find their machines themselves, stop cleanly on scancel and resume from the bucket with --resume auto.

Both nodes run on this host and share one working folder (data/, checkpoints/, logs/), as cluster nodes share NFS.
"""
import contextlib
import math
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.chaos import carry_on, pause, training_argv
from tests.support.slurm_jobs import JOB, complete_steps, finished, job_processes, losses, outputs, submit, wait_for


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The shared working folder of this module's jobs (the demo data is prepared there once)."""
    return tmp_path_factory.mktemp("slurm-work")


def ranks_of(work: Path, run: str) -> list[int]:
    """The pids of `run`'s training processes (`python train.py`, not the preflight or the launcher)."""
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if (argv := training_argv(pid)) and str(work / "bucket") in argv and run in argv]


def stop_arrived(pid: int) -> bool:
    """A stop signal waits at the stopped process `pid` (or Slurm already continued it, or it is gone)."""
    try:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":\t" in line)
    except OSError:
        return True
    waiting = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    return not status["State"].startswith("T") or any(waiting >> (sig - 1) & 1 for sig in (signal.SIGTERM,
                                                                                             signal.SIGINT))


def test_two_nodes_train_stop_on_scancel_and_resume(slurm, work):
    """sbatch -N 2: one complete checkpoint per save; scancel mid-run saves a newer one on both nodes and exits 0;
    the same line again with --resume auto reaches the uninterrupted run's losses."""
    ref = submit(slurm, work, "ref", "--max-steps", "20", "--save-every", "4")
    info = finished(slurm, work, ref)
    assert info["NodeList"] == "n[1-2]" and info["ExitCode"] == "0:0"
    assert complete_steps(work, "ref") == [4, 8, 12, 16, 20]
    log = outputs(work, ref)
    assert "2 process(es)" in log and "stopped at step 20: max steps reached" in log, log
    want = losses(work, "ref")
    assert sorted(want) == list(range(1, 21))

    line = ("--max-steps", "20", "--save-every", "4", "--resume", "auto")
    cut = submit(slurm, work, "cut", *line)
    wait_for(lambda: complete_steps(work, "cut"), "the first checkpoint of the run to cancel")
    # the ranks wait (stopped) while scancel's signal makes its way to them: a run of this size is quicker than
    # Slurm's control path, and the stop must come before its last step
    ranks = wait_for(lambda: ranks_of(work, "cut"), "the ranks of the run to cancel")
    pause(ranks)
    before = complete_steps(work, "cut")
    slurm.out(["scancel", str(cut)])
    wait_for(lambda: all(map(stop_arrived, ranks)), "scancel's signal at the ranks")
    carry_on(ranks)
    finished(slurm, work, cut, "CANCELLED")
    after = complete_steps(work, "cut")
    log = outputs(work, cut)
    assert after[-1] > before[-1], (before, after, log)  # the stop's own save, complete in the bucket
    assert f"{signal.SIGTERM.name} received" in log or "asked to stop" in log, log
    assert not [line for line in log.splitlines() if line.startswith("error:")], log  # ours; Slurm's say CANCELLED
    stopped = after[-1]
    assert stopped < 20, "the cancel came too late to cut the run short"

    again = submit(slurm, work, "cut", *line)
    finished(slurm, work, again)
    assert f"at step {stopped} (" in outputs(work, again), outputs(work, again)  # resumed from the stop's save
    assert complete_steps(work, "cut")[-1] == 20
    got = losses(work, "cut")
    for step in range(stopped + 1, 21):
        assert math.isclose(got[step], want[step], rel_tol=1e-5), (step, got[step], want[step])


def test_one_node_job(slurm, work):
    """sbatch -N 1: one machine, no address or rank to find; the run trains and saves."""
    job = submit(slurm, work, "one", "--max-steps", "4", "--save-every", "2", nodes=1)
    finished(slurm, work, job)
    assert complete_steps(work, "one") == [2, 4]
    assert "1 training process(es)" in outputs(work, job)


def test_contradicting_num_machines_refused_before_start(slurm, work):
    """--num-machines 3 in a 2-node job: the error line, nothing launched, the job failed."""
    job = submit(slurm, work, "bad", "--max-steps", "4", launcher=("--num-machines", "3"))
    finished(slurm, work, job, "FAILED")  # exit 2, or 143 where srun's --kill-on-bad-exit ended the other node first
    log = outputs(work, job)
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    # Both nodes check; the first to refuse ends the step (srun --kill-on-bad-exit), and the other node, if its checks
    # were still under way, says so in start_training.sh's own line (exit 130) instead of refusing too.
    refused = "error: --num-machines 3 contradicts the Slurm allocation (2); drop --num-machines or make it 2"
    cut_short = "error: interrupted before the training processes started; nothing was trained"
    assert refused in errors and set(errors) <= {refused, cut_short} and errors.count(cut_short) <= 1, log
    assert "training process" not in log.replace(cut_short, "")  # nothing launched, so none failed
    assert not (work / "logs" / "bad").exists() and not (work / "bucket" / "bad").exists()


def test_a_node_killed_ends_the_other_and_the_job_fails(slurm, work):
    """kill -9 of every process of node 1: node 0 ends soon after (not at its collective timeout) and the job FAILED."""
    job = submit(slurm, work, "killed", "--max-steps", "1000", "--save-every", "2", "--step-timeout-minutes", "0.5")
    wait_for(lambda: complete_steps(work, "killed"), "the first checkpoint")
    for pid in wait_for(lambda: job_processes(job, node=1), "node 1's processes"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    assert slurm.wait_state(job, {"FAILED"}, JOB) == "FAILED", outputs(work, job)
    # srun's --kill-on-bad-exit ends it; the step timeout is 30 s
    assert time.monotonic() - started < bound(45), outputs(work, job)
    wait_for(lambda: not job_processes(job), "every process of the job to end", timeout=bound(30))
    assert complete_steps(work, "killed")  # the checkpoints made before stay complete

