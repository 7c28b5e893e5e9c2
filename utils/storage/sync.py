"""Verified tree sync between a Storage and a local folder: never trust a file by its mere existence.

download_tree lists the source once (names, sizes, crc32c), skips a local file only when its size and
crc32c both match, and fetches the rest in parallel through `<file>.partial` + verify + rename.
Computed crc32c values are cached in `<dest>/.crc32c-index.json`, keyed by size and mtime, so a re-run
over terabytes re-hashes nothing. upload_tree is the reverse, with the manifest (or marker) uploaded
last, so a remote folder never looks complete before all its files are there.
"""
from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Callable, Collection

from tqdm import tqdm

from utils.crc import INDEX_NAME, CrcIndex
from utils.errors import PiconeoxError
from utils.storage import PARTIAL_SUFFIX, ObjectInfo, Storage, in_flight, no_link_below, safe_relpath

__all__ = ["SyncSummary", "CrcIndex", "download_tree", "upload_tree", "safe_relpath"]

log = logging.getLogger(__name__)

@dataclass
class SyncSummary:
    """What a tree transfer did; in a dry run, what it would do.

    downloaded: files transferred (by upload_tree: uploaded); bytes: their total size.
    skipped: files already identical (size and crc32c) on the receiving side.
    failed: files that could not be transferred or were refused; errors holds one line for each.
    """

    downloaded: int = 0
    skipped: int = 0
    failed: int = 0
    bytes: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        self.failed += 1
        self.errors.append(message)


def _local_crc_if_same_size(path: Path, rel: str, size: int, index: CrcIndex) -> int | None:
    """crc32c of a local regular file of exactly `size` bytes; None when it is missing, a link or differs in size."""
    if path.is_symlink():  # never read through a link: the transfer refuses it
        return None
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    if not path.is_file() or st.st_size != size:
        return None
    return index.crc32c(rel, path, st)


def _remove_stale_partials(dest: Path) -> None:
    """Delete `*.partial` files that an interrupted earlier run left behind; they are never trusted."""
    removed = 0
    for dirpath, _dirs, files in os.walk(dest):
        for file in files:
            if file.endswith(PARTIAL_SUFFIX):
                Path(dirpath, file).unlink(missing_ok=True)
                removed += 1
    if removed:
        log.info("removed %d stale .partial file(s) under %s", removed, dest)


def _transfer_all(jobs: dict[str, tuple[int, Callable[[], ObjectInfo]]], summary: SyncSummary, *,
                  workers: int, desc: str, progress: bool) -> dict[str, ObjectInfo]:
    """Run {name: (size, transfer)} on a thread pool with a bytes/files progress bar.

    Successes are counted in `summary` and returned by name; a failure of one file (a StorageError
    or a local OSError) is recorded and the others go on.
    """
    done: dict[str, ObjectInfo] = {}
    if not jobs:
        return done
    with tqdm(total=sum(size for size, _ in jobs.values()), unit="B", unit_scale=True, unit_divisor=1024,
              desc=desc, disable=not progress, dynamic_ncols=True) as bar, \
            ThreadPoolExecutor(max_workers=workers) as pool:
        futures: dict[Future, str] = {pool.submit(transfer): name for name, (_, transfer) in jobs.items()}
        try:
            for future in as_completed(futures):
                name = futures[future]
                try:
                    done[name] = future.result()
                except (PiconeoxError, OSError) as e:
                    summary.fail(f"{name}: {e}")
                    continue
                summary.downloaded += 1
                summary.bytes += jobs[name][0]
                bar.update(jobs[name][0])
                bar.set_postfix_str(f"files {len(done)}/{len(jobs)}", refresh=False)
        except BaseException:  # Ctrl-C: start nothing new; transfers in flight end cleanly on their own
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return done


def download_tree(src: Storage, dest: Path, *, include: str | None = None, workers: int = 8,
                  dry_run: bool = False, progress: bool = True) -> SyncSummary:
    """Make `dest` hold a verified copy of every object under `src` (optionally only names matching
    the glob `include`, where '*' also crosses '/'). Objects whose names would escape `dest`, or lead through a
    symbolic link inside it, are refused and counted as failed; nothing is written outside `dest`."""
    if workers < 1:
        raise PiconeoxError(f"workers must be at least 1, got {workers}")
    start = time.perf_counter()
    listing = {name: info for name, info in src.list().items() if name != INDEX_NAME}
    if not listing:
        raise PiconeoxError(f"no objects under {src.url}: check the bucket and prefix")
    selected = {n: i for n, i in listing.items() if include is None or fnmatchcase(n, include)}
    if not selected:
        raise PiconeoxError(f"include pattern {include!r} matches none of the {len(listing)} objects under {src.url}")

    dest = Path(dest)
    if not dry_run:
        dest.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(dest)
    index = CrcIndex(dest / INDEX_NAME)
    summary = SyncSummary()
    todo: dict[str, tuple[ObjectInfo, Path]] = {}
    # With a cold index this hashes every local file once, hence the bar.
    for name, info in tqdm(sorted(selected.items()), desc="check local files", unit="file", leave=False,
                           disable=not progress):
        try:
            path = no_link_below(dest, name)
        except PiconeoxError as e:
            summary.fail(str(e))
            continue
        local_crc = _local_crc_if_same_size(path, name, info.size, index)
        if local_crc is not None and local_crc == info.crc32c:
            summary.skipped += 1
        else:
            todo[name] = (info, path)

    if dry_run:
        summary.downloaded = len(todo)
        summary.bytes = sum(info.size for info, _ in todo.values())
    else:
        def fetch(name: str, path: Path) -> ObjectInfo:
            path.parent.mkdir(parents=True, exist_ok=True)
            return src.get(name, path)

        jobs = {name: (info.size, lambda n=name, p=path: fetch(n, p)) for name, (info, path) in todo.items()}
        try:
            done = _transfer_all(jobs, summary, workers=workers, desc=f"download {src.url}", progress=progress)
            for name, got in done.items():
                index.record(name, todo[name][1].stat(), got.crc32c)
        finally:
            index.save()
    summary.seconds = time.perf_counter() - start
    return summary


def _local_files(root: Path) -> dict[str, Path]:
    """Files (and links) under root by '/'-separated relative name, without sync's own index and in-flight files."""
    files = {}
    for dirpath, dirs, names in os.walk(root):
        for file in names + [d for d in dirs if Path(dirpath, d).is_symlink()]:  # links: listed, then refused
            if file == INDEX_NAME or in_flight(file):
                continue
            path = Path(dirpath, file)
            files[path.relative_to(root).as_posix()] = path
    return files


def upload_tree(src_dir: Path, dst: Storage, *, last: str | None = "manifest.json", if_absent: bool = False,
                workers: int = 4, include: str | None = None, only: Collection[str] | None = None,
                dry_run: bool = False, progress: bool = True) -> SyncSummary:
    """Upload the files of `src_dir` (those named in `only`, if given) that `dst` lacks or holds with another size
    or crc32c. A symbolic link is never followed: it is refused and counted as failed.

    `last` (the manifest or COMPLETE marker; it must exist) goes up only after every other file
    succeeded; a stale remote copy of it is deleted before anything changes. if_absent refuses to
    overwrite any object that differs (ObjectExists, counted as failed).
    """
    if workers < 1:
        raise PiconeoxError(f"workers must be at least 1, got {workers}")
    start = time.perf_counter()
    src_dir = Path(src_dir)
    files = _local_files(src_dir) if src_dir.is_dir() else {}
    if not files:
        raise PiconeoxError(f"nothing to upload: {src_dir} is not a folder with files")
    if last is not None and last not in files:
        raise PiconeoxError(f"{src_dir} has no {last}; it is uploaded last to mark the folder complete")
    selected = {n: p for n, p in files.items() if (include is None or fnmatchcase(n, include) or n == last)
                and (only is None or n in only or n == last)}

    remote = dst.list()
    index = CrcIndex(src_dir / INDEX_NAME)

    def unchanged(name: str, path: Path) -> bool:
        info = remote.get(name)
        return bool(info and info.crc32c is not None
                    and _local_crc_if_same_size(path, name, info.size, index) == info.crc32c)

    try:
        todo = {n: p for n, p in tqdm(sorted(selected.items()), desc="check local files", unit="file",
                                      leave=False, disable=not progress) if not unchanged(n, p)}
        body = {n: p for n, p in todo.items() if n != last}
        # A changing folder must not look complete: withdraw `last` first and put it back at the end.
        withdraw = bool(body) and last in remote and not if_absent
        if withdraw:
            todo[last] = files[last]
        summary = SyncSummary(skipped=len(selected) - len(todo))
        if dry_run:
            summary.downloaded, summary.bytes = len(todo), sum(p.lstat().st_size for p in todo.values())
        else:
            if withdraw:
                dst.delete(last)
            jobs = {n: (p.lstat().st_size, lambda n=n: dst.put(no_link_below(src_dir, n), n, if_absent=if_absent))
                    for n, p in body.items()}
            _transfer_all(jobs, summary, workers=workers, desc=f"upload {dst.url}", progress=progress)
            if last in todo and not summary.failed:
                jobs = {last: (todo[last].lstat().st_size,
                               lambda: dst.put(no_link_below(src_dir, last), last, if_absent=if_absent))}
                _transfer_all(jobs, summary, workers=1, desc=f"upload {last}", progress=False)
    finally:
        if not dry_run:
            index.save()
    summary.seconds = time.perf_counter() - start
    return summary

