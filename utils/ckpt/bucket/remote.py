"""Checkpoints in a bucket: find the newest complete one and bring it into a local cache to resume from.

Remote layout, written by utils/ckpt/uploader.py: `<bucket prefix>/<run>/step-XXXXXXXX/<files>`, the
`COMPLETE` marker uploaded last. A remote folder counts only when its marker exists, so an upload cut
short (preemption, dead network) is never chosen. Downloads go through utils/storage/sync (crc32c-verified,
`.partial` files, incremental), then the marker's file sizes are checked like a local checkpoint's.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from utils.ckpt.format import MARKER, STEP_RE, check_complete, read_marker, step_dir_name
from utils.errors import PiconeoxError
from utils.storage import Storage, cache_folder, open_storage
from utils.storage.sync import download_tree


def check_upload_settings(has_store: bool, keep_remote: int, max_failures: int) -> None:
    """Refuse settings that would make the bucket unsafe or failures endless (one line each); torch-free, so
    configs check them before any launch."""
    if has_store and keep_remote < 2:
        raise PiconeoxError(f"keep_last={keep_remote}: with --checkpoint-bucket keep at least 2 checkpoints, "
                            "so the bucket always holds a complete one while the next uploads")
    if max_failures < 1:
        raise PiconeoxError(f"--max-upload-failures {max_failures}: must be at least 1")


def remote_steps(store: Storage) -> dict[int, bool]:
    """{step: whether its COMPLETE marker exists} for every step-XXXXXXXX folder under `store`, in one listing."""
    return steps_in(store.list(checksums=False))


def steps_in(names: Iterable[str]) -> dict[int, bool]:
    """{step: whether its COMPLETE marker exists} for the step-XXXXXXXX/<file> names of a listing."""
    steps: dict[int, bool] = {}
    for name in names:
        folder, _, file = name.partition("/")
        if (m := STEP_RE.match(folder)) and file:
            step = int(m.group(1))
            steps[step] = steps.get(step, False) or file == MARKER
    return steps


def delete_step(store: Storage, names: Iterable[str], step: int) -> None:
    """Delete step `step`'s objects among the listing `names`, its marker first: a deletion cut short leaves a
    partial step (which a later save or start removes), never a complete-looking one with files missing."""
    prefix = f"{step_dir_name(step)}/"
    mine = [name for name in names if name.startswith(prefix)]
    for name in sorted(mine, key=lambda name: name != prefix + MARKER):
        store.delete(name)


def latest_complete_step(steps: dict[int, bool]) -> int | None:
    """The highest step whose marker exists, or None."""
    return max((step for step, complete in steps.items() if complete), default=None)


def remote_marker(store: Storage, step: int) -> dict:
    """The COMPLETE marker of a remote step folder (a one-line PiconeoxError when it is not a marker)."""
    with tempfile.TemporaryDirectory() as tmp:
        store.child(step_dir_name(step)).get(MARKER, Path(tmp) / MARKER)
        marker = read_marker(Path(tmp))
    if marker is None:
        raise PiconeoxError(f"{store.url}/{step_dir_name(step)}/{MARKER} is unreadable")
    return marker


def newest_verified(store: Storage, steps: dict[int, bool], warn) -> tuple[int, dict] | None:
    """(step, marker) of the newest complete step whose files the bucket lists with the marker's sizes and crc32c;
    a newer step that does not match (a damaged or overwritten object) is reported with `warn` and skipped."""
    for step in sorted((s for s, complete in steps.items() if complete), reverse=True):
        name = step_dir_name(step)
        try:
            marker = remote_marker(store, step)
            listed = store.child(name).list()
        except PiconeoxError as e:
            warn(f"skipping bucket checkpoint {store.url}/{name}: {e}")
            continue
        bad = next((f for f, want in marker["files"].items() if f not in listed or listed[f].size != want["size"]
                    or listed[f].crc32c not in (None, want["crc32c"])), None)
        if bad is None:
            return step, marker
        warn(f"skipping bucket checkpoint {store.url}/{name}: {bad} " + ("is missing" if bad not in listed else
             f"has {listed[bad].size} bytes, crc32c {listed[bad].crc32c}; the marker says "
             f"{marker['files'][bad]['size']}, {marker['files'][bad]['crc32c']}"))
    return None


def download_checkpoint(store: Storage, step: int, cache_dir: Path, progress: bool = True) -> Path:
    """Download `step-XXXXXXXX/` of `store` into `cache_dir` (crc32c-checked) and return the complete folder;
    other step folders in `cache_dir` (earlier downloads) are removed."""
    name = step_dir_name(step)
    folder = Path(cache_dir) / name
    summary = download_tree(store.child(name), folder, progress=progress)
    if summary.failed:
        raise PiconeoxError(f"{summary.failed} file(s) of {store.url}/{name} failed to download into {folder}; "
                            f"first: {summary.errors[0]}")
    reason = check_complete(folder)
    if reason:
        raise PiconeoxError(f"downloaded {store.url}/{name}, but {reason}")
    for step_folder in Path(cache_dir).glob("step-*"):  # older downloads: a multi-GB cache must not grow per resume
        if step_folder != folder:
            shutil.rmtree(step_folder, ignore_errors=True)
    return folder


def cache_dir_for(url: str, cache_root: Path) -> Path:
    """Where checkpoints of the run at `url` are cached (utils.storage.cache_folder: cache_root/<bucket>/<prefix>, or
    for a directory used as a bucket, cache_root/local/<its absolute path>)."""
    return cache_folder(cache_root, url)


def resolve_url(url: str, credentials: str | None, *, timeout_s: float = 60,
                flag: str = "--resume ") -> tuple[Storage, int]:
    """`--resume gs://bucket/prefix/<run>[/step-XXXXXXXX]`: the run's remote folder and its newest complete step
    (or the step named, which must be complete). One-line PiconeoxError otherwise, naming `flag`."""
    base, _, last = url.rstrip("/").rpartition("/")
    if STEP_RE.match(last):
        store = open_storage(base, credentials, timeout_s=timeout_s)
        step = int(last[len("step-"):])
        if not remote_steps(store).get(step):
            raise PiconeoxError(f"{flag}{url}: no {MARKER} marker there (an unfinished upload or no such step)")
        return store, step
    store = open_storage(url, credentials, timeout_s=timeout_s)
    step = latest_complete_step(remote_steps(store))
    if step is None:
        raise PiconeoxError(f"{flag}{url}: no complete step-XXXXXXXX checkpoint (one with {MARKER}) there")
    return store, step
