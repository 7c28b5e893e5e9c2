"""How a run ends, as one exit code that survives `accelerate launch` (README: "Exit codes").

    0   done (max steps, time limit, early stopping, or a clean stop on SIGTERM/Ctrl-C)
    2   refused: a setting, file or state the user can fix; one `error:` line, nothing of the run kept
    3   trained, but the newest checkpoint never reached --checkpoint-bucket; one line gives the command
        that finishes the upload (utils/push_checkpoint.py)
    130 interrupted at once (a second Ctrl-C)

Through the launcher a worker's own exit code is lost: accelerate exits 1 for any failure of one process and
torchrun raises a ChildFailedError with a traceback for several. So utils/launch.py sets $PICONEOX_STATUS_DIR,
each worker records its code and message there instead of printing it (N ranks would print N copies), and the
launcher prints rank 0's line (else the lowest rank's) once and exits with its code.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

DONE, REFUSED, NOT_UPLOADED, INTERRUPTED = 0, 2, 3, 130
STATUS_DIR_ENV = "PICONEOX_STATUS_DIR"


def finish(code: int, message: str) -> int:
    """End this process with `code`: print `message` (one line) unless a launcher collects it; returns `code`."""
    folder = os.environ.get(STATUS_DIR_ENV)
    if folder and Path(folder).is_dir():
        rank = int(os.environ.get("RANK", "0"))
        with contextlib.suppress(FileExistsError):  # the first outcome of a rank is its outcome
            fd = os.open(Path(folder) / f"rank-{rank:05d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(f"{code}\n{message}")
            return code
    print(message, file=sys.stderr, flush=True)
    return code


def collected(folder: Path) -> tuple[int, str] | None:
    """(code, message) recorded by rank 0, else by the lowest rank that recorded one; None when none did."""
    for path in sorted(Path(folder).glob("rank-*")):
        code, _, message = path.read_text(encoding="utf-8").partition("\n")
        return int(code), message
    return None
