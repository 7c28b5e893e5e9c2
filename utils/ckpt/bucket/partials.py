"""Crashes do not leak storage: partial step folders of a run are removed once a newer complete step exists.

A killed attempt leaves `step-N/` without its COMPLETE marker, on disk and in the bucket. It is never trusted,
and without this it would never be removed either: a crash-looping job would leak up to one checkpoint per
crash. A partial step is removed only when it is OLDER than the newest complete step of the same place (a newer
one may be a save still in flight), at the start of a run and after each checkpoint that completes.

Rank 0 decides: its disk and the bucket hold the markers (other machines hold only their own shards, never a
marker). At the start it tells every machine which steps it holds complete; each machine then removes its own
copies of the other, older steps, and rank 0 alone deletes in the bucket.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from utils.ckpt.format import MARKER, step_dir_name, step_folders
from utils.ckpt.bucket.remote import delete_step, steps_in
from utils.distributed import broadcast_object
from utils.errors import PiconeoxError
from utils.storage import Storage


def stale(steps: dict[int, bool], complete: set[int] = frozenset()) -> list[int]:
    """Steps without a marker (and not in `complete`) that are older than the newest complete step."""
    done = {step for step, has_marker in steps.items() if has_marker} | set(complete)
    newest = max(done, default=None)
    return sorted(step for step in steps if step not in done and newest is not None and step < newest)


def local_steps(run_dir: Path) -> dict[int, bool]:
    """{step: whether its marker is on this disk} for every step folder of `run_dir`."""
    return {step: (folder / MARKER).is_file() for step, folder in step_folders(run_dir)}


def remove_local(run_dir: Path, complete: set[int] = frozenset()) -> list[int]:
    """Remove this machine's partial step folders older than the newest complete step; `complete`: steps
    complete on rank 0's disk (a machine holding only its own shards has no markers). Returns the steps."""
    steps = stale(local_steps(run_dir), complete)
    for step in steps:
        shutil.rmtree(Path(run_dir) / step_dir_name(step), ignore_errors=True)
    return steps


def remove_remote(store: Storage, listing=None) -> list[int]:
    """Rank 0: delete the bucket's partial step folders older than its newest complete one; returns the steps.
    `listing`: names under `store` when the caller has just listed it."""
    names = list(store.list(checksums=False) if listing is None else listing)
    steps = stale(steps_in(names))
    for step in steps:
        delete_step(store, names, step)
    return steps


def describe(local: list[int], remote: list[int], run_dir: Path, url: str | None) -> str:
    """One line saying which partial steps went where ('' when none did)."""
    where = [f"{', '.join(map(str, local))} from {run_dir}"] if local else []
    where += [f"{', '.join(map(str, remote))} from {url}"] if remote else []
    return f"removed partial checkpoint step(s) {' and '.join(where)} (interrupted saves: no {MARKER} marker, " \
           "older than a complete step)" if where else ""


def clean_at_start(accelerator, run_dir: Path, bucket: Storage | None, log) -> set[int]:
    """Every rank: remove the run's partial steps older than its newest complete step, locally on every machine
    and (rank 0) in the bucket, in one INFO line. Returns the steps complete on rank 0's disk, which every
    machine's rotation then counts as complete. Best effort: a failure is a warning, never a stop."""
    complete = None
    if accelerator.is_main_process:
        complete = sorted(step for step, has_marker in local_steps(run_dir).items() if has_marker)
    complete = broadcast_object(complete)  # before any deleting: no rank waits while rank 0 talks to the bucket
    local, remote = [], []
    try:
        if accelerator.is_local_main_process:
            local = remove_local(run_dir, set(complete))
        if accelerator.is_main_process and bucket is not None:
            remote = remove_remote(bucket)
    except (PiconeoxError, OSError) as e:
        log.warning(f"could not remove every partial checkpoint of {run_dir.name}: {e}")
    if accelerator.is_main_process and (line := describe(local, remote, run_dir, bucket.url if bucket else None)):
        log.info(line)
    return set(complete)
