"""start_training.sh's last part (it execs this, so this process keeps the script's pid): run the preflight, start
the launcher, pass each Ctrl-C, SIGTERM or SIGHUP on to the training processes, exit with the run's code and release
the run lock.

In Python, not bash: bash dropped a SIGINT that came while it waited for a check (the preflight) to return, and ran
no trap for one that landed as its `wait` began; the run started or went on training. Here the handlers are set
first thing, and the C-level handler writes each signal to a pipe (`signal.set_wakeup_fd`) that the loop selects
on beside the child's pidfd: a signal at any moment wakes it, and no wait can miss one.

    python -S utils/run/supervise.py LOCK_NOTE PROCESSES N PREFLIGHT(N words) LAUNCH...
"""
import signal

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_early: list[int] = []  # the stop signals that came before the forwarder was ready
if __name__ == "__main__":  # first of all, so that no stop signal finds Python's default (a KeyboardInterrupt)
    for _sig in FORWARDED:
        signal.signal(_sig, lambda sig, _frame: _early.append(sig))

import os  # noqa: E402  (after the handlers, on purpose)
import select  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

if __name__ == "__main__":  # run as a file: the repository's `utils`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from utils.run.lifeline import children_of, detach_terminal  # noqa: E402

PENDING_SECONDS = 30  # how long a forwarded stop waits for a starting training process to handle it
BEFORE_LAUNCH = "error: interrupted before the training processes started; nothing was trained"


def say(line: str, stream=None) -> None:
    try:
        print(line, file=stream or sys.stderr, flush=True)
    except OSError:  # a closed terminal
        pass


def handles_stops(pid: int) -> bool:
    """Whether `pid` catches SIGTERM yet (/proc/PID/status SigCgt): a training process that is still starting does
    not, and a signal there is a traceback from whatever it imports, or its death. True when unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = next((line.split()[1] for line in f if line.startswith("SigCgt:")), None)
    except OSError:
        return True
    return caught is None or bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def _send(send) -> None:
    try:
        send()
    except (ProcessLookupError, PermissionError):  # ended meanwhile
        pass


class Supervisor:
    """Runs one child at a time in a process group of its own (a terminal's Ctrl-C reaches only this process) and
    answers each stop signal: the launcher's children, the training processes, get it (each saves and exits, and the
    launcher then exits with their code). Before they exist there is nothing to save: the child in hand (the
    preflight, or a launcher still starting) gets SIGTERM, which ends a starting Python quietly."""

    def __init__(self):
        self.child: subprocess.Popen | None = None
        self.launched = False  # the child is the launcher (else the preflight)
        self.stopped = False  # a stop signal came before any training process existed
        self.pending: list[tuple[int, int, float]] = []  # (pid, signal, until when it may wait) for starting workers
        self._wake, write = os.pipe()
        for fd in (self._wake, write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for sig in FORWARDED:
            signal.signal(sig, self.forward)

    def forward(self, sig: int, _frame=None) -> None:
        if sig == signal.SIGHUP:  # the terminal is gone and writing to it would fail; training.log keeps everything
            detach_terminal()
        workers = children_of(self.child.pid) if self.launched and not self.stopped else []
        say(f"start_training.sh: {signal.Signals(sig).name}: " + ("asking the run to save and stop (a second Ctrl-C "
            "stops at once)" if workers else "no training process runs yet: stopping"))
        self.pending += [(pid, sig, time.monotonic() + PENDING_SECONDS) for pid in workers]
        self.send_pending()
        if not workers:
            self.stopped = True
            if self.child:
                _send(lambda: os.killpg(self.child.pid, signal.SIGTERM))

    def send_pending(self) -> None:
        """Pass each forwarded signal on once its process handles stops (or has waited PENDING_SECONDS)."""
        waiting = []
        for pid, sig, until in self.pending:
            if handles_stops(pid) or time.monotonic() > until:
                _send(lambda: os.kill(pid, sig))
            else:
                waiting.append((pid, sig, until))
        self.pending = waiting

    def run(self, command: list[str], launcher: bool = False, **popen) -> int:
        """Start `command` (unless a stop came first: then -SIGTERM) and wait for it, forwarding stop signals."""
        if self.stopped:
            return -signal.SIGTERM
        self.child = subprocess.Popen(command, preexec_fn=os.setpgrp, **popen)
        self.launched = launcher
        if self.stopped:  # the stop came while it started
            _send(lambda: os.killpg(self.child.pid, signal.SIGTERM))
        try:
            pidfd = os.pidfd_open(self.child.pid)  # readable once the child has exited
        except (AttributeError, OSError):  # Linux before 5.3, other systems: a poll each second
            pidfd = None
        while self.child.poll() is None:
            # the handlers run in this thread between calls; the pipe only wakes the select
            select.select([self._wake] + ([pidfd] if pidfd is not None else []), [], [], 0.05 if self.pending else 1.0)
            while _drain(self._wake):
                pass
            self.send_pending()
        if pidfd is not None:
            os.close(pidfd)
        return self.child.returncode


def _drain(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def shell_code(returncode: int) -> int:
    """A child's exit as a shell reports it: 128 + N for a signal N."""
    return 128 - returncode if returncode < 0 else returncode


def supervise(note: Path, processes: str, preflight: list[str], launch: list[str]) -> int:
    """The preflight, then the launch with the folder it synced (if any); the run's exit code."""
    supervisor = Supervisor()
    for sig in _early:
        supervisor.forward(sig)
    checked = supervisor.run(preflight, env={**os.environ, "PICONEOX_RUN_LOCK_NOTE": str(note)},
                             stdout=subprocess.PIPE, text=True)
    synced = supervisor.child.stdout.read().strip() if supervisor.child else ""
    if supervisor.stopped:
        say(BEFORE_LAUNCH)
        return 130
    if checked != 0:  # its one error line is said
        return shell_code(checked)
    if synced:
        launch = [*launch, "--data", synced]
        say(f"data synced to {synced}", sys.stdout)
    say(f"start_training.sh: {processes} training process(es) under accelerate launch (--dry-run prints the "
        "command)", sys.stdout)
    lifeline = Path(__file__).with_name("lifeline.py")
    code = supervisor.run([sys.executable, str(lifeline), str(os.getpid()), *launch], launcher=True)
    if supervisor.stopped and code == -signal.SIGTERM:  # ended by the forwarded SIGTERM before its workers existed
        say(BEFORE_LAUNCH)
        return 130
    return shell_code(code)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or not argv[2].isdigit():
        print("usage: python -S utils/run/supervise.py LOCK_NOTE PROCESSES N PREFLIGHT(N words) LAUNCH...",
              file=sys.stderr)
        return 2
    note, count = Path(argv[0]), int(argv[2])
    try:
        return supervise(note, argv[1], argv[3:3 + count], argv[3 + count:])
    finally:  # the locks the preflight took in this pid's name (their note's text: one lock file per line)
        from utils.run import runlock
        try:
            runlock.main(["release", note.read_text(), str(os.getpid())])
        except OSError:
            pass
        note.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
