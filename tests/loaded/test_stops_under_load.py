"""Stops that hold on a busy box: both cores taken by `yes` from the moment the runs train
(their start-up stays fast), each run at nice 10, each stop tried several rounds. Real start_training.sh launches of
train.py (gloo ranks on CPU); every wait is for an event.

The stops are made all at once (the `stops` fixture, tests/support/loaded.all_at_once): every run starts and trains
on the free box, then both cores are loaded and each stop is made in its own thread, the other runs being the box's
other jobs. One window of load for all, where one per stop took the cores from the rest of the suite for minutes.
Each test checks its own stop.
"""
import os
import signal
import subprocess
import sys

import pytest

from tests.support.bounds import bound
from tests.support.loaded import (ROUNDS, Failed, Stop, all_at_once, carry_on, ended, output, paused, start,
                                  training, tree, wait_for)
from tests.support.paths import REPO
from utils.ckpt.format import check_complete, read_marker, step_dir_name

MEDIUM = ["--set", "model.hidden_size=512", "--set", "model.num_layers=6", "--set", "model.num_heads=8", "--set",
          "model.intermediate_size=2048"]  # a 240 MB checkpoint: its write takes seconds on a busy box


def clean(text: str) -> None:
    assert "Traceback" not in text and "error:" not in text, text[-3000:]


def saving_step(work) -> int:
    return int(output(work).split(" received: saving step ")[1].split()[0])


def training_run(procs: int, *extra: str):
    """A `ready` step: the run trains on every rank; its ranks wait, stopped, until the stop continues them."""
    def ready(work, data):
        proc = start(work, data, procs, *extra)
        wait_for(f"{procs} rank(s) training", lambda: training(work, procs), proc)
        return work, proc, paused(proc)
    return ready


def continued(state):
    work, proc, pids = state
    carry_on(pids)
    return work, proc


def second_ctrl_c_in_flight(state):
    work, proc = continued(state)
    family = tree(proc.pid)
    proc.send_signal(signal.SIGINT)
    wait_for("the stop's write", lambda: "writing step" in output(work).partition(" received: saving")[2], proc)
    folder = work / "ckpt" / "r" / step_dir_name(saving_step(work))
    written_before = (folder / "COMPLETE").exists()
    proc.send_signal(signal.SIGINT)
    return (*ended(proc, family), work, folder, written_before)


def ctrl_c_after_the_next_lines(state):
    work, proc = continued(state)
    family = tree(proc.pid)
    proc.send_signal(signal.SIGINT)
    wait_for("the next: lines", lambda: "next:" in output(work), proc)
    proc.send_signal(signal.SIGINT)
    return (*ended(proc, family), work)


def sigterm_to_every_process(state):
    work, proc = continued(state)
    family = tree(proc.pid)
    assert len(family) >= 4, family  # the script, the launcher, two ranks
    for pid, _ in family:
        os.kill(pid, signal.SIGTERM)
    return (*ended(proc, family), work)


NO_LOCKS = r"""
import errno, fcntl, sys
from pathlib import Path
def flock(fd, op):  # NFS without lockd
    raise OSError(errno.ENOLCK, 'No locks available')
fcntl.flock = flock
from utils.data.source import preparing
from utils.run import runlock
for _ in range(2):
    with preparing(Path(sys.argv[1]) / "data" / "demo"):
        print("prepared", flush=True)
with runlock.holding(sys.argv[1], "r", "train.py"):
    print("held", flush=True)
"""


def prepare_without_locks(work):
    work.mkdir(parents=True)
    return work, subprocess.run([sys.executable, "-c", NO_LOCKS, str(work)], cwd=REPO, capture_output=True,
                                text=True, timeout=bound(300), env={**os.environ, "PYTHONPATH": str(REPO)})


LAUNCHER_MOMENTS = {  # when the Ctrl-C reaches start_training.sh alone: inside its checks, or just after the launch
    "in the checks": lambda work: (work / "ckpt" / ".locks" / "r.lock").exists(),
    "after the launch": lambda work: "under accelerate launch" in output(work),
}


def ctrl_c_to_the_launcher(moment: str):
    """An `act` that starts its run under load and signals start_training.sh alone at `moment`."""
    def act(state):
        work, data = state
        proc = start(work, data, 2)
        wait_for(moment, lambda: LAUNCHER_MOMENTS[moment](work), proc)
        family = tree(proc.pid)
        proc.send_signal(signal.SIGINT)
        return (*ended(proc, family), work)
    return act


def as_given(work, data):
    return work, data


STOPS = {
    **{f"second-ctrl-c-{r}": Stop(training_run(1, *MEDIUM, "--save-every", "1000"), second_ctrl_c_in_flight)
       for r in range(2)},
    **{f"after-next-{r}": Stop(training_run(2), ctrl_c_after_the_next_lines) for r in range(ROUNDS)},
    **{f"sigterm-all-{r}": Stop(training_run(2), sigterm_to_every_process) for r in range(ROUNDS)},
    "no-locks": Stop(lambda work, data: work, prepare_without_locks),
    **{f"launcher-{moment.replace(' ', '-')}-{r}": Stop(as_given, ctrl_c_to_the_launcher(moment))
       for moment in LAUNCHER_MOMENTS for r in range(ROUNDS)},
}


@pytest.fixture(scope="module")
def stops(tmp_path_factory, tiny_data) -> dict:
    return all_at_once(STOPS, tmp_path_factory.mktemp("stops"), tiny_data)


def outcome(stops: dict, name: str):
    result = stops[name]
    if isinstance(result, Failed):
        raise result.error
    return result


@pytest.mark.parametrize("round_", range(2))
def test_a_second_ctrl_c_ends_everything_at_once_while_a_save_is_in_flight(stops, round_):
    """The second Ctrl-C came while the flush was writing; the run used to wait for that write (the
    uploader thread, the flush), or for the grace, before it ended. Now: 130, one line, the write is cut short."""
    code, left, work, folder, written_before = outcome(stops, f"second-ctrl-c-{round_}")
    text = output(work)
    assert code == 130 and left == [], (code, left, text[-3000:])
    assert "Traceback" not in text and text.strip().endswith("error: interrupted"), text[-3000:]
    assert written_before or not (folder / "COMPLETE").exists()  # nothing waited for the write in flight
    assert not (work / "ckpt" / ".locks").exists()


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_a_ctrl_c_after_the_clean_stop_printed_its_next_lines_is_no_failure(stops, round_):
    """The second Ctrl-C reached the ranks after their outcome was decided (or while the interpreter
    exited, where Python's handlers are back to the default): `a training process failed with exit code -2`."""
    code, left, work = outcome(stops, f"after-next-{round_}")
    assert code == 0 and left == [], (code, left, output(work)[-3000:])
    clean(output(work))
    assert check_complete(work / "ckpt" / "r" / step_dir_name(saving_step(work))) is None


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_sigterm_to_every_process_of_the_run_at_once_is_a_clean_stop(stops, round_):
    """scancel, systemd or a container runtime signal every process: utils/launch.py printed torch
    elastic's SignalException traceback and exited 1. Now the same step is saved by every rank and it exits 0."""
    code, left, work = outcome(stops, f"sigterm-all-{round_}")
    text = output(work)
    assert code == 0 and left == [], (code, left, text[-3000:])
    clean(text)
    assert "SIGTERM received; stopped cleanly" in text
    folder = work / "ckpt" / "r" / step_dir_name(saving_step(work))
    assert check_complete(folder) is None and read_marker(folder)["world_size"] == 2  # both ranks' shards


def test_preparing_data_on_a_filesystem_without_locks_warns_once_and_goes_on(stops):
    """utils/data/source.py flocked on its own and died with an ENOLCK traceback; one helper now, one
    warning line for the process (the run lock's and the data's)."""
    work, done = outcome(stops, "no-locks")
    assert done.returncode == 0 and done.stdout == "prepared\nprepared\nheld\n", done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"warning: {work / 'data'} has no file locks "
                                                                   "(ENOLCK"), done.stderr


@pytest.mark.parametrize("moment", LAUNCHER_MOMENTS)
@pytest.mark.parametrize("round_", range(ROUNDS))
def test_a_ctrl_c_to_the_launcher_before_the_ranks_train_ends_it(stops, moment, round_):
    """Found by the sweep: a SIGINT to start_training.sh alone during its checks was dropped (bash waits for the
    check in progress and then goes on without a trap: the run started and trained) or killed the script (-2).
    Just after the launch it was lost as well (bash's `wait` had taken it and ran no trap until the run ended), or
    reached a launcher still importing: a KeyboardInterrupt traceback and exit 1."""
    code, left, work = outcome(stops, f"launcher-{moment.replace(' ', '-')}-{round_}")
    text = output(work)
    assert code in (0, 130) and left == [], (code, left, text[-3000:])  # 0: a rank had trained, a clean stop
    assert "Traceback" not in text
    if code == 130:  # the script's line before any rank started, a rank's own once one had
        last = text.strip().splitlines()[-1]  # the supervisor's, or a rank's own (in its imports, or after them)
        assert last == "error: interrupted" or (last.startswith("error: interrupted") and
                                                last.endswith("nothing was trained")), text[-2000:]
