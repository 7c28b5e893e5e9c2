"""Nothing of a run outlives its launcher by more than the grace period.

Three pieces, each for a way a run used to be left behind:
- `die_with_parent`: PR_SET_PDEATHSIG. A process whose parent dies without a word (SIGKILL, the OOM killer)
  gets SIGTERM, the clean-stop signal: start_training.sh starts `accelerate launch` through this module's
  CLI, and every train.py binds itself to accelerate (torchrun starts each worker in a session of its own,
  so no signal to the launcher's process group reaches them).
- `GraceDeadline`: a worker whose clean stop cannot finish (a peer is gone or stuck, and this process waits
  in a collective, where no Python signal handler runs) ends itself once the grace has passed; a second Ctrl-C
  ends it at once (exit 130), from a thread, so nothing the main thread waits for (a flush, a peer) holds it.
- `detach_terminal`: after a SIGHUP the terminal is gone; writing to it would fail, so output goes to
  /dev/null (training.log keeps everything).

    python -m utils.run.lifeline LAUNCHER_PID COMMAND...   # exec COMMAND, bound to LAUNCHER_PID
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import stat
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
LAUNCH_PID_ENV = "PICONEOX_LAUNCH_PID"  # the pid of `accelerate launch`, the parent of every worker
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
GRACE_EXCEEDED_EXIT = 1
_worker = False  # set by bind_worker(): a training process started as a script


def die_with_parent(expected_parent: int | None = None, sig: int = signal.SIGTERM) -> None:
    """Get `sig` when the parent process dies; at once if it is already gone (not `expected_parent` any more).

    Linux only (elsewhere a no-op); kept across exec.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)  # the parent died before the binding: act as if it died after


def bind_worker() -> None:
    """A training process: SIGTERM when `accelerate launch` (its parent) dies; a GraceDeadline then also covers
    the interpreter's exit (thread joins, atexit handlers), not only the training function."""
    global _worker
    _worker = True
    launch = os.environ.get(LAUNCH_PID_ENV, "")
    die_with_parent(int(launch) if launch.isdigit() else None)


def children_of(pid: int) -> list[int]:
    """The pids whose parent is `pid`, read from /proc (slim images have no pgrep)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(") ", 1)[1].split()  # after "pid (name) ": state, parent pid, ...
        except (OSError, IndexError):  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.parent.name))
    return found


def is_worker() -> bool:
    """Whether this process is a training process started as a script (`bind_worker`)."""
    return _worker


def detach_terminal() -> None:
    """Point stdin/stdout/stderr that are terminals (character devices) at /dev/null; files and pipes stay."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        try:
            if stat.S_ISCHR(os.fstat(fd).st_mode):
                os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


class GraceDeadline:
    """Ends the process `grace_seconds` after a stop signal (or `stop.request()`) if it has not ended by then.

    The C-level signal handler writes each signal to a socket (`signal.set_wakeup_fd`) even while the main
    thread waits inside a collective; a watcher thread reads it. Use as a context manager around the part of
    the run whose signals the clean stop handles (the StopRequest must be installed inside it).
    """

    def __init__(self, stop):
        self.stop = stop
        self._done = threading.Event()
        self._signalled_at: float | None = None  # the first stop signal this watcher read
        self._times: tuple[float, float] | None = None  # the main thread's run and wait times then

    def __enter__(self) -> GraceDeadline:
        self._read, write = socket.socketpair()
        write.setblocking(False)
        self._write = write
        self._previous_fd = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="grace-deadline", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if not (_worker and self._started() is not None):  # a stopping worker is watched until it is gone
            self._done.set()
        signal.set_wakeup_fd(self._previous_fd)

    def _started(self) -> float | None:
        remaining = self.stop.remaining()
        requested = None if remaining is None else time.monotonic() - (self.stop.grace_seconds - remaining)
        return min((t for t in (requested, self._signalled_at) if t is not None), default=None)

    def _watch(self) -> None:
        while not self._done.is_set():
            if select.select([self._read], [], [], 0.2)[0]:
                self._read_signals(self._read.recv(64))
            start = self._started()
            if start is not None and time.monotonic() - start >= self.stop.grace_seconds and not self._done.is_set():
                if self.stop.outcome is not None:  # the run ended, only its exit lags: its own code
                    exit_now(self.stop.outcome, "")
                late = f"--grace-seconds {self.stop.grace_seconds:g} ran out: {self.stop.late(start, self._times)}"
                if self.stop.saved is not None:  # the checkpoint is saved: only the closing lines are cut
                    say(f"warning: {late}; the checkpoint is saved, exiting without the closing lines")
                    exit_now(self.stop.saved, "")
                exit_now(GRACE_EXCEEDED_EXIT, f"error: the clean stop did not finish: {late}; exiting without it: "
                         "the last complete checkpoint stays")

    def _read_signals(self, received: bytes) -> None:
        """Note the first stop signal; a Ctrl-C after an earlier stop signal or request ends the process now (the
        handler's KeyboardInterrupt waits for the main thread): 130, or the run's own code once it has ended."""
        for signum in received:
            if signum not in STOP_SIGNALS or self._done.is_set():
                continue
            if self.stop.outcome is not None and _worker:
                exit_now(self.stop.outcome, "")  # the run has ended: a late signal is no failure
            asked_before = self._signalled_at is not None or (self.stop.requested and not self.stop.by_signal)
            if signum == signal.SIGINT and asked_before:
                exit_now(130, "error: interrupted")  # utils.errors.INTERRUPTED
            if self._signalled_at is None:
                self._signalled_at, self._times = time.monotonic(), main_thread_times()


def main_thread_times() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of this process's main thread, from the scheduler's
    own accounting (/proc/PID/task/PID/schedstat); (CPU seconds of the process, 0) where it is missing."""
    try:
        ran, queued = open(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat").read().split()[:2]
        return int(ran) / 1e9, int(queued) / 1e9
    except (OSError, ValueError):
        return time.process_time(), 0.0


def exit_now(code: int, message: str) -> None:
    """End the process at once, from any thread: record `message` for the launcher, else write it to stderr
    without blocking (a full pipe nobody reads must not hold the exit); no flush, no thread join."""
    from utils import errors  # not at the top: this file also runs as a script, before `utils` is importable

    if not errors.record(code, message) and message:
        say(message)
    os._exit(code)


def say(line: str) -> None:
    """`line` to stderr without blocking (a full pipe nobody reads must not hold an exit)."""
    err = os.dup(2)
    os.set_blocking(err, False)
    try:
        os.write(err, f"{line}\n".encode())
    except OSError:
        pass
    finally:
        os.close(err)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m utils.run.lifeline LAUNCHER_PID COMMAND [ARGS...]", file=sys.stderr)
        return 2
    die_with_parent(int(argv[0]))
    os.environ[LAUNCH_PID_ENV] = str(os.getpid())  # exec keeps the pid: the workers' parent
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
