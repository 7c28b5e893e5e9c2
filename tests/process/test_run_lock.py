"""The run lock (utils/run/runlock.py) across processes: a live holder refuses a second writer, a dead one's lock is
taken over, one of eight racers wins, the lock file is flocked as NFS needs, and a filesystem without locks gets one
warning line. The launcher's use of it is in test_lifecycle.py."""
import fcntl
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.waits import wait_for
from utils.run import runlock

HOST = socket.gethostname()


HOLD = "import sys, time\nfrom utils.run import runlock\nwith runlock.holding(sys.argv[1], 'r', 'train.py'):\n" \
       "    print('held', flush=True)\n    time.sleep(120)\n"


def test_a_live_lock_refuses_a_second_writer_and_a_dead_ones_lock_is_taken_over(tmp_path, monkeypatch):
    for var in (runlock.OWNER_ENV, runlock.MACHINE_ENV, "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    other = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert other.stdout.readline() == "held\n"
    path = runlock.lock_path(tmp_path, "r")
    assert path == tmp_path / ".locks" / "r.lock"  # beside the run folders, not inside one
    with pytest.raises(runlock.RunLocked, match=rf"^run r is still being written by pid {other.pid} \(train.py\) on "
                                                rf"{HOST} \(lock {path}\); stop it first"):
        runlock.hold(path, "r", "train.py")
    other.kill()
    other.wait()
    warnings = []
    me = runlock.hold(path, "r", "train.py", warn=warnings.append)
    assert warnings == [f"run r: taking over the lock {path} left by pid {other.pid} (train.py) on {HOST}, "
                        "no longer running"]
    assert [h["pid"] for h in lock_holders_at(path)] == [os.getpid()]
    runlock.release(path, me)
    assert not path.parent.exists()  # the last holder removes it (and the .locks folder, now empty)


RACE = "import sys, time\nfrom utils.run import runlock\ntry:\n" \
       "    runlock.hold(runlock.lock_path(sys.argv[1], 'r'), 'r', 'train.py')\n" \
       "except runlock.RunLocked:\n    sys.exit(2)\nsys.stdin.read()\n"  # the winner holds it until stdin closes


def test_of_eight_processes_that_take_one_lock_at_once_exactly_one_wins(tmp_path):
    racers = [subprocess.Popen([sys.executable, "-c", RACE, str(tmp_path)], cwd=REPO, stdin=subprocess.PIPE)
              for _ in range(8)]
    # the winner holds the lock until every other racer has ended: none can find it released and take it over
    wait_for("seven racers to end", lambda: sum(p.poll() is not None for p in racers) >= 7, timeout=bound(120))
    for p in racers:
        p.stdin.close()
    codes = [p.wait(timeout=bound(120)) for p in racers]
    assert sorted(codes) == [0] + [2] * 7
    winner = racers[codes.index(0)].pid
    assert [h["pid"] for h in lock_holders_at(tmp_path / ".locks" / "r.lock")] == [winner]


def test_the_lock_flocks_a_regular_file_open_for_writing_as_nfs_needs(tmp_path, monkeypatch):
    """NFS emulates flock with byte-range locks: a directory, or a file open read-only, fails there (EBADF)."""
    locked, real_flock = [], fcntl.flock

    def flock(fd, op):
        locked.append((os.fstat(fd).st_mode, fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE))
        return real_flock(fd, op)
    monkeypatch.setattr(fcntl, "flock", flock)
    with runlock.holding(tmp_path, "r", "train.py"):
        pass
    assert locked and all(stat.S_ISREG(mode) and access == os.O_RDWR for mode, access in locked), locked
    assert not (tmp_path / ".locks").exists()  # the guard file goes with the last lock


NO_LOCKS = "import errno, fcntl, sys\nfrom utils.run import runlock\n" \
           "def flock(fd, op):\n    raise OSError(getattr(errno, sys.argv[2]), 'No locks available')\n" \
           "fcntl.flock = flock\npath = runlock.lock_path(sys.argv[1], 'r')\ntry:\n" \
           "    runlock.hold(path, 'r', 'train.py')\nexcept runlock.RunLocked:\n    print('refused')\n" \
           "path.unlink()\nwith runlock.holding(sys.argv[1], 'r', 'train.py'):\n    print('held')\n"


@pytest.mark.parametrize("code", ["ENOLCK", "EBADF", "ENOSYS", "EOPNOTSUPP"])
def test_a_filesystem_without_locks_gets_one_warning_line_and_the_run_goes_on(tmp_path, code):
    """flock failing the NFS (ENOLCK, EBADF) or Lustre (ENOSYS) way: no traceback, the lock file still works."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PICONEOX_") and k != "TORCHELASTIC_RUN_ID"}
    runlock.lock_path(tmp_path, "r").parent.mkdir()
    runlock._write(runlock.lock_path(tmp_path, "r"), [runlock.Holder.of(os.getpid(), "train.py")])  # a live run
    done = subprocess.run([sys.executable, "-c", NO_LOCKS, str(tmp_path), code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=bound(120))
    assert done.returncode == 0 and done.stdout == "refused\nheld\n", done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"warning: {tmp_path / '.locks'} has no file "
                                                                   "locks ("), done.stderr
    assert not (tmp_path / ".locks").exists()


def lock_holders_at(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]
