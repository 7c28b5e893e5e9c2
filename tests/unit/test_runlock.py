"""The run lock's folder after a writer died mid-write (utils/run/runlock.release)."""
import os

from utils.run import runlock


def test_the_last_release_removes_a_dead_writers_temp_file_and_the_folder(tmp_path, monkeypatch):
    """A loaded run's second Ctrl-C ended a rank at once while it rewrote the lock: its `.r.lock.PID.tmp` stayed,
    so the last release kept ckpt/.locks. Every write holds the folder's guard, so a temp file there is debris."""
    for var in (runlock.OWNER_ENV, runlock.MACHINE_ENV, "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    path = runlock.lock_path(tmp_path, "r")
    me = runlock.hold(path, "r", "train.py")
    (path.parent / f".{path.name}.{os.getpid() + 1}.tmp").write_text("")  # the dead rank's torn write
    runlock.release(path, me)
    assert not path.parent.exists()
