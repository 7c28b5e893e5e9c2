"""Reading untrusted bytes stops on the first SIGTERM, SIGINT or SIGHUP, whatever it is doing.

A training run's handlers only ask for a clean stop at the next micro-step (utils/run/preemption.py): a load
that is still walking a hostile pickle would never get there. Inside `stoppable(what)` the first such signal
is passed to the handler there before (the run records its stop) and then raises LoadStopped, one line, from
wherever the main thread is: the bounded walk and the unpicklers are Python code, and what they hand to C is
bounded to seconds (utils/ckpt/untrusted/bounded.py). Off the main thread (where no signal arrives) it changes nothing.
"""
from __future__ import annotations

import contextlib
import signal
import threading

from utils.errors import PiconeoxError

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_active: list[str] = []  # what the outermost stoppable() block reads


class LoadStopped(PiconeoxError):
    """A stop signal arrived while untrusted bytes were read; nothing was loaded."""


def _handle(previous: dict, signum: int, frame) -> None:
    before = previous.get(signum)
    if callable(before):
        with contextlib.suppress(KeyboardInterrupt):  # Python's default SIGINT handler: replaced by our line
            before(signum, frame)
    raise LoadStopped(f"stopped by {signal.Signals(signum).name} while reading {_active[0]}; nothing was loaded")


@contextlib.contextmanager
def stoppable(what):
    """Within the block a stop signal raises LoadStopped (main thread only; nested blocks are one)."""
    if _active or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict = {}
    _active.append(str(what))
    try:
        for sig in SIGNALS:
            if signal.getsignal(sig) not in (signal.SIG_IGN, None):  # SIGHUP under nohup stays ignored
                previous[sig] = signal.signal(sig, lambda s, f: _handle(previous, s, f))
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _active.clear()
