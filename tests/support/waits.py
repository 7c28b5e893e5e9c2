"""Waiting for events, not for guessed times: a test polls for what it needs (a file, a line, a process state)
and the timeout only catches a hang (tests/support/bounds.py scales every bound to the box's load)."""
from __future__ import annotations

import time
from pathlib import Path

from tests.support.bounds import bound


def wait_for(what: str, check, timeout: float | None = None, every: float = 0.1):
    """Poll `check()` until it returns something true and return that; fail naming `what` after `timeout` s (a hang
    bound: by default `bound(90)`)."""
    timeout = bound(90) if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what} not within {timeout:g} s"
        time.sleep(every)
    return result


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` (R, S, D, T stopped, Z zombie), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent to reap it."""
    return process_state(pid) not in (None, "Z")


def command_line(pid: int) -> list[str]:
    """The argv `pid` runs now (after an exec, the new program's), [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except (FileNotFoundError, ProcessLookupError):
        return []
