"""The project's user-error class and the one way a CLI reports it.

Raise PiconeoxError for anything the user can fix (bad flag, bad file, mismatched data). Every CLI's `main`
is wrapped in `cli`, which prints `error: <message>` to stderr and exits 2, so the message must be one clear
line naming the bad value and what is allowed. Never put credentials in the message. The CLIs parse their flags
with CliParser, so a flag mistake is that same one line too (argparse would print its whole usage first).

How a run ends, as one exit code that survives `accelerate launch` (docs/runs.md: "Exit codes").

    0   done (max steps, time limit, early stopping, or a clean stop on SIGTERM/Ctrl-C)
    2   refused: a setting, file or state the user can fix; one `error:` line, nothing of the run kept
    3   trained, but the newest checkpoint never reached --checkpoint-bucket; one line gives the command
        that finishes the upload (utils/push_checkpoint.py)
    1   another process of the run died (a peer's kill -9, a crashed node); one line, the last checkpoint stays
    130 interrupted at once (a second Ctrl-C)

Through the launcher a worker's own exit code is lost: accelerate exits 1 for any failure of one process and
torchrun raises a ChildFailedError with a traceback for several. So utils/launch.py sets $PICONEOX_STATUS_DIR,
each worker records its code and message there instead of printing it (N ranks would print N copies), and the
launcher prints rank 0's line (else the lowest rank's) once and exits with its code.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import functools
import os
import re
import sys
import threading
from pathlib import Path
from typing import Callable, NoReturn


class PiconeoxError(Exception):
    """A user-fixable problem, reported as one line without a traceback."""


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of `error`'s message for a one-line report; its type's name when the message is empty (a
    MemoryError usually has none)."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


class CliParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line `error: ...` and exit 2, like every other user mistake."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def at_least(low: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number >= `low`, else CliParser's one line naming the value and the bound."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        return value

    return whole


class Interrupted(PiconeoxError):
    """Ctrl-C, saying what was kept; `cli` reports it as one line with exit code 130."""


def cli(main: Callable[..., int | None]) -> Callable[..., int]:
    """A CLI's `main(argv=None)` as an entry point: a PiconeoxError is one `error: ...` line and exit code 2,
    Ctrl-C is one line and exit code 130; never a traceback for a user's mistake."""

    @functools.wraps(main)
    def run(argv=None) -> int:
        code = _outcome(main, argv)
        if code == DONE:
            record(DONE, "")  # under the launcher: this rank is done (a signal that comes later is no failure)
        if any(t.is_alive() for t in _UNSTOPPABLE):
            # native work that ignores Ctrl-C still runs on a thread: at interpreter shutdown it would be
            # unwound from inside Rust or C++ and abort the process ("FATAL: exception not rethrown", -6)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code

    return run


_UNSTOPPABLE: list[threading.Thread] = []


def exit_process(code: int) -> NoReturn:
    """A CLI's last line (`exit_process(main())`): what Python's exit does first (join the threads that are not
    daemons, run the atexit handlers, flush), then os._exit without the interpreter's teardown. With torch and
    transformers loaded, that teardown's garbage collection over every module took 1.0-1.7 s of CPU per process after
    the work was done and said (gdb: gc_collect_main under finalize_modules), in every rank, launcher and stop."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # logging's flush, weakref finalizers (temp folders), multiprocessing's, trackers'
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: Python's exit would say nothing either
            stream.flush()
    os._exit(code)


def leave_running(thread: threading.Thread) -> None:
    """`thread` runs native code that cannot be stopped: the CLI that left it ends without Python's shutdown."""
    _UNSTOPPABLE.append(thread)


def _outcome(main: Callable[..., int | None], argv) -> int:
    """main's exit code, a caught error reported as one line with its code."""
    try:
        return main(argv) or 0
    except Interrupted as e:
        return finish(INTERRUPTED, f"error: {e}")
    except PiconeoxError as e:  # under utils/launch.py the launcher prints it once, for every rank
        return finish(REFUSED, f"error: {e}")
    except OSError as e:  # the safety net for a write no check foresaw: a full or read-only disk is no bug
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        where = f"{e.filename}: " if e.filename else ""
        fix = "choose a writable folder" if e.errno == errno.EROFS else "free some space or choose another folder"
        return finish(REFUSED, f"error: {where}{e.strerror}; {fix}")
    except KeyboardInterrupt:  # recorded like any outcome: under the launcher too, 130 and one line
        return finish(INTERRUPTED, "error: interrupted")
    except RuntimeError as e:  # gloo's way of saying that another process of the group died: no bug of this one
        if not (gone := peer_gone(e)):
            raise
        return finish(PEER_LOST, f"error: {gone}; this one stops too, without a save: the last complete checkpoint "
                      "stays, and --resume auto continues it")


DONE, PEER_LOST, REFUSED, NOT_UPLOADED, INTERRUPTED = 0, 1, 2, 3, 130
PEER_GONE = re.compile(r"Connection (?:closed|reset) by peer(?: \[[^\]]*\]:\d+)?|Broken pipe")
STATUS_DIR_ENV = "PICONEOX_STATUS_DIR"


def peer_gone(e: BaseException) -> str | None:
    """'another process of the run is gone (gloo: ...)' when `e` is gloo's word that a peer died, else None: the
    gist of gloo's paragraph (which also blames 'bugs in the application')."""
    found = PEER_GONE.search(str(e)) if isinstance(e, RuntimeError) else None
    return f"another process of the run is gone (gloo: {found.group(0)})" if found else None


def record(code: int, message: str) -> bool:
    """Record this rank's outcome for the launcher that collects it (the first outcome of a rank is its outcome);
    False when no launcher collects (no $PICONEOX_STATUS_DIR). No print, no lock: safe from a watcher thread."""
    folder = os.environ.get(STATUS_DIR_ENV)
    if not (folder and Path(folder).is_dir()):
        return False
    name = f"rank-{int(os.environ.get('RANK', '0')):05d}"
    # written whole, then linked into place: the launcher never reads a half-written outcome, and link() keeps
    # the first one (it fails where the name exists)
    temp = Path(folder) / f".{name}.{os.getpid()}.{threading.get_ident()}"
    try:
        with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
            f.write(f"{code}\n{message}")
        with contextlib.suppress(FileExistsError):
            os.link(temp, Path(folder) / name)
    finally:
        temp.unlink(missing_ok=True)
    return True


def finish(code: int, message: str) -> int:
    """End this process with `code`: print `message` (one line) unless a launcher collects it; returns `code`."""
    if not record(code, message):
        print(message, file=sys.stderr, flush=True)
    return code


def outcomes(folder: Path) -> list[tuple[int, str]]:
    """(code, message) of every rank that recorded its outcome, by rank (a finished run records 0 too)."""
    found = []
    for path in sorted(Path(folder).glob("rank-*")):
        code, _, message = path.read_text(encoding="utf-8").partition("\n")
        found.append((int(code), message))
    return found


def collected(folder: Path) -> tuple[int, str] | None:
    """(code, message) of the lowest rank that failed (rank 0 first); None when none did."""
    return next((found for found in outcomes(folder) if found[0]), None)
