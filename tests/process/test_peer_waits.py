"""Waits for peers that never come: a second machine whose machine 0 never starts, and train.py under leftover
RANK/WORLD_SIZE/MASTER_ADDR. Each says in one line what it waits for and for how long; a Ctrl-C or SIGTERM (a pod
deleted) ends the wait at once with 130, and the bound with exit 2; a stop while the training processes start is one
line and 130 too, never a traceback."""
import signal
import sys

import pytest

from tests.support.chaos import tree
from tests.support.paths import REPO
from tests.support.peers import Waiter, second_machine
from tests.support.slurm import free_ports
from tests.support.waits import command_line, wait_for

WAITING = "start_training.sh: waiting for machine 0 at 127.0.0.1:"


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_ends_a_machine_waiting_for_machine_0_at_once(tmp_path, sig):
    waiter = second_machine(tmp_path, free_ports(1)[0])
    try:
        waiter.wait_for_line(WAITING)
        assert "at most 900 s (--rendezvous-timeout-seconds); Ctrl-C stops waiting" in waiter.err
        waiter.proc.send_signal(sig)  # the supervisor, as a terminal's Ctrl-C or a pod's deletion reaches it
        code, _ = waiter.finish(timeout=30)  # before: still waiting after 60 s (torchrun's 900 s bound)
    finally:
        waiter.kill()
    line = one_error_line(waiter.err)
    assert code == 130 and "interrupted while waiting for machine 0 at 127.0.0.1" in line, waiter.err
    assert "nothing was trained" in line and not list(tmp_path.glob("checkpoints/*/step-*"))


def test_a_pod_deleted_while_it_waits_for_its_master_ends_at_once(tmp_path):
    """A Kubernetes torch job's second pod (MASTER_ADDR, WORLD_SIZE, RANK), its master never up: SIGTERM, what a pod's
    deletion sends, ends it (it was still there a minute later)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports(1)[0]), "WORLD_SIZE": "2", "RANK": "1"}
    waiter = Waiter([str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--data", "demo"],
                    cwd=tmp_path, env=env)
    try:
        waiter.wait_for_line(WAITING)
        waiter.proc.send_signal(signal.SIGTERM)
        code, _ = waiter.finish(timeout=30)
    finally:
        waiter.kill()
    assert code == 130 and "interrupted while waiting for machine 0" in one_error_line(waiter.err), waiter.err


def test_a_machine_waiting_for_machine_0_gives_up_after_the_bound(tmp_path):
    waiter = second_machine(tmp_path, free_ports(1)[0], "--rendezvous-timeout-seconds", "2")
    try:
        code, _ = waiter.finish()
    finally:
        waiter.kill()
    line = one_error_line(waiter.err)
    assert code == 2 and "waited 2 s for machine 0 at 127.0.0.1" in line and "--rendezvous-timeout-seconds" in line


def leftover_group(tmp_path, *extra: str) -> Waiter:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports(1)[0])}
    return Waiter([sys.executable, str(REPO / "train.py"), "--config", "test", "--data", "demo", *extra],
                  cwd=tmp_path, env=env)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_ends_train_py_waiting_for_a_group_from_the_environment(tmp_path, sig):
    waiter = leftover_group(tmp_path)
    try:
        waiter.wait_for_line("rank 1 of 2 waits for the others at 127.0.0.1:")
        assert "(at most 900 s: --rendezvous-timeout-seconds; Ctrl-C stops waiting)" in waiter.err
        waiter.proc.send_signal(sig)
        code, _ = waiter.finish(timeout=30)
    finally:
        waiter.kill()
    line = one_error_line(waiter.err)
    assert code == 130 and "interrupted while waiting for the other 1 process(es) of the group" in line, waiter.err


def test_train_py_waiting_for_a_group_from_the_environment_gives_up_after_the_bound(tmp_path):
    waiter = leftover_group(tmp_path, "--rendezvous-timeout-seconds", "2")
    try:
        code, _ = waiter.finish()
    finally:
        waiter.kill()
    line = one_error_line(waiter.err)
    assert code == 2 and "waited 2 s for the other 1 process(es) of the group at 127.0.0.1" in line, waiter.err


def test_a_ctrl_c_while_the_training_processes_start_is_one_line_and_130(tmp_path):
    """The signal lands in the workers' imports (or their interpreter's start): it used to be a KeyboardInterrupt
    traceback and `a training process failed with exit code -2`."""
    waiter = Waiter([str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", "2", "--data",
                     "demo"], cwd=tmp_path)
    try:
        def workers():
            return [pid for pid, _ in tree(waiter.proc.pid) if "train.py" in " ".join(command_line(pid))
                    and "--preflight" not in command_line(pid)]
        wait_for("the training processes", lambda: workers() or waiter.proc.poll() is not None, every=0.01)
        waiter.proc.send_signal(signal.SIGINT)
        code, _ = waiter.finish()
    finally:
        waiter.kill()
    assert code == 130 and one_error_line(waiter.err).startswith("error: interrupted"), waiter.err
