"""A run's two folders, checkpoints/<run> and logs/<run>: whether they hold an earlier run, and claiming them.

An earlier run is a folder holding a run's own record: a checkpoint (step-XXXXXXXX/, best/, final/, anything with
a run_config.json) or its logs' record (TensorBoard event files, history.json, a W&B folder). Anything else (a
training.log of a refused attempt, a user's notes) is not a run, and a new run may start beside it.

A run is accepted only after every check that can refuse it, and some need the folders (the log file, a
tracker's first files). So `RunClaim` notes what these folders held before, creates them, and, when the run is
refused before its first step, removes exactly what this attempt added (a refused resume also takes its lines
back out of the earlier run's training.log); an earlier run's files are never touched.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import time
from pathlib import Path

from utils.atomic import check_writable_dir
from utils.errors import PiconeoxError

CHECKPOINT_RECORDS = ("best", "final", "run_config.json")
LOG_RECORDS = ("history.json", "wandb")


def run_records(folder: Path) -> list[str]:
    """The names in `folder` that show an earlier run was there (sorted; empty when none)."""
    if not folder.is_dir():
        return []
    found = set()
    for entry in folder.iterdir():
        name = entry.name
        if (name.startswith(("step-", "events.out.tfevents")) or name in CHECKPOINT_RECORDS + LOG_RECORDS
                or (entry / "run_config.json").is_file()):
            found.add(name)
        elif entry.is_dir() and any(entry.rglob("events.out.tfevents*")):
            found.add(f"{name}/ (event files)")
    return sorted(found)


def check_new_run(resume: str | None, run_dir: Path, log_dir: Path) -> None:
    """A run without --resume never writes into an earlier run's folders (its best/ and logs would be lost)."""
    check_writable_dir(run_dir, "--output-dir")
    check_writable_dir(log_dir, "--log-dir")
    if resume:
        return
    for folder in (run_dir, log_dir):
        if found := run_records(folder):
            shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
            raise PiconeoxError(f"{folder} holds an earlier run ({shown}): pass --resume auto to continue it, or "
                                "--run-name NAME (after `--` for start_training.sh) to start a new one beside it")


class RunClaim:
    """Create a run's folders, remembering what they held, so that a refusal can take back what it added."""

    def __init__(self, *folders: Path):
        self.folders = [Path(f) for f in folders]
        self.created: list[Path] = []  # the folders each mkdir created, deepest first
        self.before: dict[Path, int | None] = {}  # every path below the folders: a file's size, None for a folder
        self.accepted = False

    def make(self) -> None:
        for folder in self.folders:
            self.created += [p for p in (folder, *folder.parents) if not p.exists()]
            folder.mkdir(parents=True, exist_ok=True)
            for path in folder.rglob("*"):
                self.before[path] = path.stat().st_size if path.is_file() and not path.is_symlink() else None

    def accept(self) -> None:
        """The run passed every check: from now on its files stay, whatever happens."""
        self.accepted = True

    def release(self) -> None:
        """Refused before its first step: remove what this attempt added (nothing of an earlier run)."""
        if self.accepted:
            return
        for folder in self.folders:
            if not folder.is_dir():
                continue
            for path in sorted(folder.rglob("*"), key=lambda p: -len(p.parts)):  # deepest first
                if path not in self.before:
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
                elif (size := self.before[path]) is not None and path.is_file() and path.stat().st_size > size:
                    os.truncate(path, size)  # a log this attempt appended to
        for folder in self.created:  # only while empty: another run may have created its own folder beside ours
            with contextlib.suppress(OSError):
                folder.rmdir()


def keep_earlier_best(run_dir: Path, log) -> None:
    """`--resume auto` found no complete checkpoint, so this run starts fresh: an earlier attempt's best/ (a stop
    before its first checkpoint) moves aside instead of being replaced at the first evaluation."""
    best = run_dir / "best"
    if best.is_dir():
        stamp = time.strftime("best-earlier-%Y%m%d-%H%M%S", time.gmtime())
        kept = run_dir / stamp
        for n in itertools.count(2):  # two fresh starts in one second: a rename onto the first would replace it
            if not kept.exists():
                break
            kept = run_dir / f"{stamp}-{n}"
        best.rename(kept)
        log.warning(f"--resume auto starts fresh: the earlier attempt's {best} is kept as {kept}")


def claim_run_dirs(resume: str | None, run_dir: Path, log_dir: Path, is_main: bool, cleanup) -> RunClaim:
    """Rank 0 (it alone writes checkpoints) checks and creates the run's folders, every rank learns the outcome;
    until `accept()`, leaving `cleanup` with an exception takes back what this attempt created."""
    from utils.distributed import rank0_decides

    claim = RunClaim(run_dir, log_dir)
    rank0_decides(lambda: (check_new_run(resume, run_dir, log_dir), claim.make()), is_main)
    if is_main:
        cleanup.push(lambda exc_type, *_: claim.release() if exc_type else None)
    return claim
