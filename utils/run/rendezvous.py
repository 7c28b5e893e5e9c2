"""Waiting for the other processes of a group: a bound on the wait, and a stop signal that ends it at once.

A process that waits for its peers (rank 1 of a group from leftover RANK/WORLD_SIZE/MASTER_ADDR, or the Accelerator of
any rank while the others start) sits inside torch's TCPStore in C++, where no Python signal handler runs: a Ctrl-C
was noted and acted on only when the wait ended (an hour later, with the collective timeout as its bound). Here a
thread reads the signals (`signal.set_wakeup_fd`: the C-level handler writes each one to a socket even while the main
thread waits) and a clock: a stop signal ends the process at once with 130 (nothing was trained, nothing to save),
and a wait longer than `--rendezvous-timeout-seconds` ends it with one line saying what never came.

Before the run's own handlers exist (imports, argument parsing) a stop signal ends the process the same way
(`stop_before_start`): Python's default printed a KeyboardInterrupt traceback from whatever import ran, and a
SIGTERM killed the process outright, which the launcher reported as a failure.
"""
from __future__ import annotations

import math
import signal
import socket
import sys
import threading
import time

from utils.errors import INTERRUPTED, REFUSED, PiconeoxError

DEFAULT_TIMEOUT_SECONDS = 900.0  # torch's rendezvous default (torchrun's LaunchConfig, `--rdzv-conf timeout=`)
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
NOTHING_TRAINED = "nothing was trained"


def check_rendezvous_timeout(seconds: float, flag: str = "--rendezvous-timeout-seconds") -> None:
    """A wait for peers from 1 s to a week."""
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and 1 <= seconds <= 7 * 24 * 3600):
        raise PiconeoxError(f"{flag} {seconds}: must be a number of seconds from 1 to 604800 (a week; default "
                            f"{DEFAULT_TIMEOUT_SECONDS:g}, torch's rendezvous timeout)")


def _exit(code: int, message: str, record: bool = True) -> None:
    """End the process now; the message recorded for the launcher (a training process) or written to stderr."""
    import os

    if record:
        from utils.run.lifeline import exit_now

        exit_now(code, message)
    try:
        os.write(2, f"{message}\n".encode())
    except OSError:
        pass
    os._exit(code)


_exiting = False
_original: dict[int, object] = {}  # the handlers stop_before_start replaced


def _before_start(signum: int, _frame) -> None:
    global _exiting
    if _exiting:  # a second signal while the first one's exit runs
        return
    _exiting = True
    _exit(INTERRUPTED, f"error: interrupted ({signal.Signals(signum).name}) before the run started; "
          f"{NOTHING_TRAINED}")


def stop_before_start() -> None:
    """A training process's first call: until `main_started()`, a stop signal ends it at once with 130 and one line.
    A signal ignored at start (SIGHUP under nohup) stays ignored."""
    import utils.run.lifeline  # noqa: F401  (now: an import inside the handler could meet a half-imported module)

    for sig in STOPS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            _original[sig] = signal.signal(sig, _before_start)


def main_started() -> None:
    """From here the usual handlers again: a Ctrl-C is a KeyboardInterrupt that `cli` reports after the run took back
    what it created, and the run installs its own (utils/run/preemption.py) once it has something to save; until then
    the supervisor holds a stop for a process that does not catch SIGTERM (utils/run/supervise.py)."""
    for sig, handler in _original.items():
        signal.signal(sig, handler)
    _original.clear()


class PeerWait:
    """`with PeerWait(what, timeout)`: the code inside waits for peers (`what`: who, and where); a stop signal ends
    the process at once (130), and so does the clock after `timeout` seconds (exit 2, one line naming `what`).

    For a launcher (`waiting`, `own_handlers=False`): its own handlers stay (they pass stops on to the training
    processes), and the thread acts only while `waiting()` says no training process exists yet; `record=False`:
    the line goes to stderr, not to the launcher's own outcome folder."""

    def __init__(self, what: str, timeout: float, fix: str = "", waiting=lambda: True, own_handlers: bool = True,
                 record: bool = True, announce: str = ""):
        self.what, self.timeout, self.fix, self.waiting, self.announce = what, timeout, fix, waiting, announce
        self.own_handlers, self.record = own_handlers, record
        self._done = threading.Event()
        self._active = False  # from before the announce to __exit__: a stop signal then ends the wait (`interrupt`)
        self._ending = threading.Lock()  # one of the thread and `interrupt` says the line and exits

    def __enter__(self) -> PeerWait:
        self._read, write = socket.socketpair()
        write.setblocking(False)
        self._write = write
        main = threading.current_thread() is threading.main_thread()  # handlers and the wakeup fd live there only
        self._previous = {s: signal.signal(s, lambda *_: None) for s in STOPS if main and self.own_handlers
                          and signal.getsignal(s) is not signal.SIG_IGN}  # the C handler wakes the thread
        self._previous_fd = -1 if not main else signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        self._main = main
        self._thread = threading.Thread(target=self._watch, name="peer-wait", daemon=True)
        self._thread.start()
        self._active = True
        if self.announce:  # once a stop signal ends the wait: a test (or a user) may act on the line at once
            print(self.announce, file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc) -> None:
        self._active = False
        self._done.set()
        if self._main:
            signal.set_wakeup_fd(self._previous_fd)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._thread.join()
        self._read.close()
        self._write.close()

    def _watch(self) -> None:
        import select

        deadline = time.monotonic() + self.timeout
        while not self._done.is_set():
            if not self.waiting():
                return  # the training processes run: the launcher's wait is over, its handlers take every stop
            if select.select([self._read], [], [], 0.2)[0]:
                stops = [s for s in self._read.recv(64) if s in STOPS]
                if stops and not self._done.is_set() and self.waiting():
                    self._end(INTERRUPTED, f"error: interrupted while waiting for {self.what}; {NOTHING_TRAINED}")
            if time.monotonic() >= deadline and not self._done.is_set() and self.waiting():
                self._end(REFUSED, f"error: waited {self.timeout:g} s for {self.what} in vain"
                          f"{'; ' + self.fix if self.fix else ''} (--rendezvous-timeout-seconds sets the bound); "
                          f"{NOTHING_TRAINED}")

    def _end(self, code: int, message: str) -> None:
        if self._ending.acquire(blocking=False):
            _exit(code, message, self.record)
        threading.Event().wait()  # the other one exits the process

    def interrupt(self) -> None:
        """For a launcher's own stop handler (`own_handlers=False`; it runs in the main thread, possibly before the
        thread reads the signal): during the wait, end the process with the wait's line; else return."""
        if self._active and not self._done.is_set() and self.waiting():
            if self._ending.acquire(blocking=False):
                _exit(INTERRUPTED, f"error: interrupted while waiting for {self.what}; {NOTHING_TRAINED}",
                      self.record)
            threading.Event().wait()  # the thread says its line and exits the process
