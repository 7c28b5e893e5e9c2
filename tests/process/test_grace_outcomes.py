"""What a grace that runs out says and leaves (utils/run/lifeline.GraceDeadline with a real StopRequest, in a
process of its own: the deadline ends it with os._exit). Once the stop's checkpoint is saved, only the closing lines
are cut: the run's own exit code and one warning. Before that: exit 1 and one line saying what the stop was doing
and where its time went, not "a peer process is gone" when none was."""
import subprocess
import sys

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO

STOP = r"""
import sys, time
from utils.run.lifeline import GraceDeadline
from utils.run.preemption import StopRequest

saved, busy = sys.argv[1] == "saved", sys.argv[2] == "busy"
stop = StopRequest(grace_seconds=1).install()
with GraceDeadline(stop):
    stop.request("SIGTERM received")
    stop.doing = lambda: "saving step 7 (writing step-00000007)"
    if saved:
        stop.saved, stop.doing = 0, "writing the closing lines"
    end = time.monotonic() + 60
    while time.monotonic() < end:  # the grace ends it long before
        if not busy:
            time.sleep(0.05)
print("not ended by the grace", file=sys.stderr)
"""


def grace_runs_out(saved: str, busy: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", STOP, saved, busy], capture_output=True, text=True, cwd=REPO,
                          timeout=bound(60))


def test_a_grace_that_runs_out_after_the_save_keeps_the_runs_exit_code():
    proc = grace_runs_out("saved", "waiting")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        proc.stderr.strip()] and proc.stderr.startswith("warning: --grace-seconds 1 ran out: still writing the "
                                                        "closing lines after 1 s"), proc.stderr
    assert proc.stderr.strip().endswith("the checkpoint is saved, exiting without the closing lines"), proc.stderr


# a main thread that spins worked all along, or waited for a CPU on a busy box: never "waiting for another process"
@pytest.mark.parametrize("busy, why", [("waiting", ("it was waiting for another process (one may be gone or stuck)",)),
                                       ("busy", ("it worked all along", "the machine is busy"))])
def test_a_grace_that_runs_out_before_the_save_says_what_it_was_doing_and_where_the_time_went(busy, why):
    proc = grace_runs_out("unsaved", busy)
    line = proc.stderr.strip()
    assert proc.returncode == 1 and len(line.splitlines()) == 1, proc.stderr
    assert line.startswith("error: the clean stop did not finish: --grace-seconds 1 ran out: still saving step 7 "
                           "(writing step-00000007) after 1 s; its main thread ran "), line
    assert any(w in line for w in why) and line.endswith("exiting without it: the last complete checkpoint stays"), line
