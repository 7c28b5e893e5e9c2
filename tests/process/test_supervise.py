"""utils/run/supervise.py, start_training.sh's last part, with plain-Python stand-ins for the preflight and the
launcher: a stop signal ends the run the right way in each phase, the preflight's verdict and synced folder reach the
launch, and the lock note goes. (tests/loaded/ stops real runs through it.)"""
import signal
import subprocess
import sys

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.waits import wait_for
from utils.run.supervise import BEFORE_LAUNCH

# the preflight: says `ready` in a file, then prints argv[2] (a synced folder) or waits to be ended
PREFLIGHT = """import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("ready")
if sys.argv[2] == "wait":
    time.sleep(300)
print(sys.argv[2])
sys.exit(int(sys.argv[3]))
"""
# the launcher: its argv in a file, then one worker that notes the signal it gets and exits 0, as train.py's clean
# stop does; the launcher itself dies by a signal
LAUNCHER = """import pathlib, subprocess, sys
pathlib.Path(sys.argv[1]).write_text(" ".join(sys.argv[2:]))
sys.exit(subprocess.call([sys.executable, "-c", '''import pathlib, signal, sys, time
def stop(sig, _frame):
    pathlib.Path(sys.argv[1]).write_text(signal.Signals(sig).name)
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
pathlib.Path(sys.argv[1]).write_text("running")
time.sleep(300)''', sys.argv[1] + ".worker"]))
"""


def supervise(tmp_path, synced: str = "", preflight_code: int = 0) -> subprocess.Popen:
    note = tmp_path / "note"
    note.write_text("")
    preflight = [sys.executable, "-c", PREFLIGHT, str(tmp_path / "preflight"), synced, str(preflight_code)]
    launch = [sys.executable, "-c", LAUNCHER, str(tmp_path / "launcher"), "--config", "test"]
    return subprocess.Popen([sys.executable, "-S", str(REPO / "utils" / "run" / "supervise.py"), str(note), "2",
                             str(len(preflight)), *preflight, *launch], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_during_the_preflight_ends_it_and_launches_nothing(tmp_path, sig):
    proc = supervise(tmp_path, synced="wait")
    wait_for("the preflight", lambda: (tmp_path / "preflight").exists() or proc.poll() is not None)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=bound(30))
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == BEFORE_LAUNCH, err
    assert "no training process runs yet: stopping" in err and "Traceback" not in err
    assert not (tmp_path / "launcher").exists() and not (tmp_path / "note").exists()


def test_a_ctrl_c_once_the_workers_run_goes_to_them_and_the_run_ends_with_their_code(tmp_path):
    proc = supervise(tmp_path, synced=str(tmp_path / "synced"))
    worker = tmp_path / "launcher.worker"
    wait_for("the worker", lambda: worker.exists() or proc.poll() is not None)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=bound(30))
    assert proc.returncode == 0 and worker.read_text() == "SIGINT", (proc.returncode, err)
    assert "start_training.sh: SIGINT: asking the run to save and stop" in err and "Traceback" not in err
    assert out.splitlines() == [f"data synced to {tmp_path / 'synced'}", "start_training.sh: 2 training "
                                "process(es) under accelerate launch (--dry-run prints the command)"]
    assert (tmp_path / "launcher").read_text() == f"--config test --data {tmp_path / 'synced'}"
    assert not (tmp_path / "note").exists()


def test_a_refused_preflight_is_its_exit_code_and_no_launch(tmp_path):
    proc = supervise(tmp_path, preflight_code=2)
    out, err = proc.communicate(timeout=bound(30))
    assert proc.returncode == 2 and "under accelerate launch" not in out and err == ""
    assert not (tmp_path / "launcher").exists() and not (tmp_path / "note").exists()
