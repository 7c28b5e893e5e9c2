"""kill -9 of a run's whole process tree at a moment chosen by an event in its files, checked while the tree is frozen.

A moment of a ./start_training.sh attempt (run `r` under `work`, as tests/support/chaos.py launches it), read from
its folders once every rank holds the run's lock: `save` (a step folder of this attempt without its COMPLETE: a
save in flight, its shards being written or uploaded), `complete` (a COMPLETE of this attempt appeared since the
last look, a few milliseconds ago), `training` (this attempt's newest checkpoint complete here and in the bucket,
no save in flight: between saves, mid-step). When the files show it, every process of the tree is stopped
(SIGSTOP), the files are read again, and only if the moment still holds is the tree killed; else it carries on
and the wait goes on. So the kill lands in the moment named, not in whatever came a few milliseconds later.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.support.bounds import bound
from tests.support.chaos import alive, carry_on, pause, tree
from utils.ckpt.format import MARKER, check_complete, latest_complete, step_folders

RESUMED = re.compile(r"resumed from (\S+) at step (\d+) ")
MOMENTS = ("training", "save", "complete")


def look(work: Path, procs: int, since: float) -> dict | None:
    """What the folders of the attempt started at `since` (time.time()) with `procs` ranks show now: None until
    every rank holds the run's lock."""
    run, bucket = work / "ckpt" / "r", work / "bucket" / "r"
    try:
        if (work / "ckpt" / ".locks" / "r.lock").read_text().count('"rank ') < procs:
            return None
        fresh = [folder for _, folder in step_folders(run) if folder.stat().st_mtime >= since]
    except FileNotFoundError:  # not there yet, or rotated away meanwhile
        return None
    done = [folder for folder in fresh if check_complete(folder) is None]
    return {"saving": any(not (folder / MARKER).is_file() for folder in fresh), "done": {f.name for f in done},
            "uploaded": bool(done) and check_complete(bucket / done[-1].name) is None}


def holds(moment: str, now: dict | None, before: dict | None) -> bool:
    """Whether `moment` holds `now`; `before` is the look a poll earlier (a COMPLETE newer than it just appeared)."""
    if now is None:
        return False
    if moment == "save":
        return now["saving"]
    if moment == "complete":
        return bool(now["done"] - (before or {"done": set()})["done"])
    assert moment == "training", moment
    return bool(now["done"]) and not now["saving"] and now["uploaded"]


def kill_at(work: Path, proc: subprocess.Popen, procs: int, moment: str, timeout: float) -> dict:
    """Wait (at most `timeout` s) for `moment` of the attempt `proc`, then SIGKILL its whole tree at once; what the
    folders held then: the newest complete step here and in the bucket, and the step folders left half-written."""
    since, end, before = time.time(), time.monotonic() + timeout, None
    while proc.poll() is None:
        if time.monotonic() > end:
            raise TimeoutError(f"no {moment!r} moment within {timeout} s: see {work}/attempts.log")
        if holds(moment, now := look(work, procs, since), before):
            frozen = tree(proc.pid)
            pause([pid for pid, _ in frozen])
            if holds(moment, look(work, procs, since), before):
                return _kill(work, proc, tree(proc.pid) + frozen, moment)
            carry_on([pid for pid, _ in frozen])  # it moved on while being stopped: wait for the next one
        before = now
        time.sleep(0.005)
    raise AssertionError(f"the attempt ended (exit {proc.returncode}) before its {moment!r} moment: see "
                         f"{work}/attempts.log")


def _kill(work: Path, proc: subprocess.Popen, procs: list[tuple[int, int]], moment: str) -> dict:
    for pid, _ in procs[::-1]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    end = time.monotonic() + bound(30)
    while alive(procs):  # SIGKILL is not refused: this only waits for the kernel to reap them
        assert time.monotonic() < end, f"processes {alive(procs)} outlived their SIGKILL"
        time.sleep(0.05)
    run, bucket = work / "ckpt" / "r", work / "bucket" / "r"
    newest = [latest_complete(where, warn=lambda _: None) for where in (run, bucket)]
    return {"moment": moment, "complete": max((int(f.name.removeprefix("step-")) for f in newest if f), default=0),
            "half_written": [f.name for _, f in step_folders(run) if not (f / MARKER).is_file()]}


def resumed_step(log: str) -> int:
    """The step an attempt's log says it resumed from (one resume line, else an assertion names the log)."""
    found = RESUMED.findall(log)
    assert len(found) == 1, log[-3000:]
    return int(found[0][1])
