"""SIGTERM/SIGINT: a clean stop at a micro-step or inside eval, agreed by all ranks, saved, flushed, exit 0."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.ranks import start_two_ranks
from tests.support.training import TINY, run
from utils import lm
from utils.ckpt.format import check_complete, latest_complete, step_dir_name
from utils.errors import PiconeoxError
from utils.run.preemption import StopRequest

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")


def test_signal_sets_the_flag_and_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest(grace_seconds=5) as stop:
        assert not stop.requested and stop.remaining() is None
        sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.reason == "SIGTERM received"
        remaining = stop.remaining()
        assert 5 - (time.monotonic() - sent) <= remaining <= 5  # the grace counts down from the signal
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C does not wait for the clean stop
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(PiconeoxError, match="--grace-seconds 0: must be a positive number of seconds"):
        StopRequest(0)


RANKS_SCRIPT = r"""
import json, math, os, signal, sys, time
import torch
from accelerate import Accelerator
from utils.run.preemption import StopRequest, StopVote

mode = sys.argv[1]
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
stop = StopRequest(5).install()
deadline = math.inf
if mode == "clock":  # rank 1's clock is past the limit from the start; rank 0's passes it at call 7
    deadline = time.time() + 3600 if rank == 0 else 0.0
vote = StopVote(stop, accelerator, deadline)
for micro in range(1000):
    if mode == "signal" and rank == 1 and micro == 7:
        os.kill(os.getpid(), signal.SIGTERM)  # only rank 1 is told
    if mode == "clock" and rank == 0 and micro == 7:
        vote.deadline = 0.0
    if vote():
        break
vote.close()
report = {"rank": rank, "stopped_at": micro, "reason": stop.reason, "time_up": vote.time_up,
          "backend": torch.distributed.get_backend(vote._group)}
sys.stdout.write(json.dumps(report) + "\n")  # one write: the ranks share the pipe, so a line must not split
sys.stdout.flush()
accelerator.wait_for_everyone()
torch.distributed.destroy_process_group()  # without it gloo may abort at exit when the other rank is gone first
# What this checks is said; the interpreter's own teardown of gloo's threads is not what it tests, and on a loaded
# box it once aborted there ("terminate called without an active exception") after the report was written.
os._exit(0)
"""


def two_ranks(mode: str) -> list[dict]:
    """RANKS_SCRIPT on two gloo ranks; each rank's report, rank 0 first."""
    procs = start_two_ranks(RANKS_SCRIPT, mode)
    outs = [p.communicate(timeout=bound(60)) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    return sorted((json.loads(out.strip().splitlines()[-1]) for out, _ in outs), key=lambda r: r["rank"])


def test_two_ranks_stop_at_the_same_micro_step_one_step_after_the_signal():
    """The vote is an asynchronous all-reduce on a CPU (gloo) group, read at the next micro-step: on a GPU
    box reading it never waits for the GPU, and both ranks still leave at the same micro-step."""
    results = two_ranks("signal")
    assert [r["stopped_at"] for r in results] == [8, 8]
    assert [r["reason"] for r in results] == ["another rank was asked to stop", "SIGTERM received"]
    assert [r["backend"] for r in results] == ["gloo", "gloo"] and not any(r["time_up"] for r in results)


def test_only_rank_0_clock_decides_the_time_limit():
    """Rank 1's clock is far past the limit, rank 0's is not: nobody stops until rank 0's time is up."""
    results = two_ranks("clock")
    assert [r["stopped_at"] for r in results] == [8, 8]
    assert all(r["time_up"] and r["reason"] is None for r in results)


def signal_on_forward(monkeypatch, call: int) -> None:
    """Deliver SIGTERM to this process during the `call`-th forward pass of the run (train or eval)."""
    calls = {"n": 0}
    real = lm.lm_loss

    def lm_loss(model, x, y):
        calls["n"] += 1
        if calls["n"] == call:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(model, x, y)

    monkeypatch.setattr(lm, "lm_loss", lm_loss)


def test_sigterm_inside_gradient_accumulation_resumes_exactly(tmp_path, tiny_data, monkeypatch):
    common = ("--max-steps", "8", "--grad-accum", "3", "--save-every", "100", "--eval-every", "100")
    _, straight, _ = run(tmp_path / "a", tiny_data, *common)
    signal_on_forward(monkeypatch, call=3 * 5 + 2)  # step 6, second of its three micro-steps
    code, losses, run_dir = run(tmp_path / "b", tiny_data, *common)
    log = (tmp_path / "b" / "logs" / "run" / "training.log").read_text()
    assert code == 0 and len(losses) == 5
    assert "SIGTERM received: saving step 5" in log and "SIGTERM received; stopped cleanly" in log
    assert latest_complete(run_dir) == run_dir / "step-00000005"
    monkeypatch.undo()
    code, resumed, _ = run(tmp_path / "b", tiny_data, *common, "--resume", "auto")
    assert code == 0 and resumed == straight  # the half-done step 6 was dropped and redone identically


def test_sigterm_before_the_first_step_ends_cleanly_with_nothing_to_publish(tmp_path, tiny_data, monkeypatch):
    """Stopped inside step 1: no checkpoint of step 0 exists, so final/ is not attempted (it used to warn that
    "final/ not written: ... is not a complete checkpoint")."""
    signal_on_forward(monkeypatch, call=1)  # step 1's first of two micro-steps
    code, losses, run_dir = run(tmp_path, tiny_data, "--max-steps", "8", "--grad-accum", "2")
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    assert code == 0 and losses == [] and "SIGTERM received; stopped cleanly" in log
    assert "WARNING" not in log and not (run_dir / "final").exists(), log


def test_sigterm_inside_eval_stops_without_a_val_loss(tmp_path, tiny_data, monkeypatch):
    signal_on_forward(monkeypatch, call=5 + 3)  # steps 1-5 train, then the third eval batch
    code, losses, run_dir = run(tmp_path, tiny_data, "--max-steps", "20", "--eval-every", "5", "--save-every", "100")
    history = json.loads((tmp_path / "logs" / "run" / "history.json").read_text())
    assert code == 0 and len(losses) == 5
    assert not [h for h in history if "val/loss" in h]  # an interrupted eval records nothing
    assert check_complete(run_dir / "step-00000005") is None and check_complete(run_dir / "final") is None


def test_sigterm_to_a_training_process_saves_locally_and_remotely(tmp_path, tiny_data, gcs_emulator):
    cmd = [sys.executable, "train.py", *TINY, "--data", str(tiny_data), "--run-name", "run",
           "--output-dir", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "logs"), "--max-steps", "100000",
           "--eval-every", "5", "--save-every", "100000", "--checkpoint-bucket", gcs_emulator.url("ckpt"),
           "--grace-seconds", "20"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "logs" / "run" / "training.log"
    limit = bound(150)  # a hang guard, not a timing goal: ~10 s of CPU, minutes on a loaded 2-core box
    deadline = time.monotonic() + limit
    while not (log.exists() and "step 5:" in log.read_text()):  # the loop runs (and handles signals)
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"no eval at step 5 within {limit:g} s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=bound(100))  # a hang bound, 10x the grace
    assert proc.returncode == 0, err  # within the grace budget: past it the run ends itself with exit 1
    assert "did not finish within --grace-seconds" not in err
    text = log.read_text()
    step = int(text.split("SIGTERM received: saving step ")[1].split()[0])
    folder = step_dir_name(step)
    assert check_complete(tmp_path / "ckpt" / "run" / folder) is None
    assert json.loads(gcs_emulator.read(f"ckpt/run/{folder}/COMPLETE"))["step"] == step
    assert f"uploaded to {gcs_emulator.url('ckpt')}/run/{folder}" in text and "Traceback" not in err
