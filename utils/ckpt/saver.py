"""What one step checkpoint's save does on every rank (utils/ckpt/uploader.py runs it on the saver thread).

Every rank writes its shard (a DCP save: a collective among the savers on their own gloo group), hashes and
uploads its files to `<bucket>/<run>/step-XXXXXXXX/` and reports to rank 0. Rank 0 writes the COMPLETE marker
(every file with its size and crc32c) only when every rank reported success, locally and then to the bucket, and
tells every rank the outcome; rank 0 prunes the bucket to the newest `keep_remote` complete checkpoints and each
machine rotates its local step folders; partial steps older than the newest complete one go too (partials.py).
Never destructive: a complete remote checkpoint is never overwritten (the marker goes up with `if_absent`, i.e.
`if_generation_match=0` on GCS, and a folder whose marker exists is left alone), and pruning deletes a folder's
marker first, so a half-deleted folder never looks complete.
"""
from __future__ import annotations

import threading
from pathlib import Path

from utils.ckpt.format import MARKER, manifest, rotate, write_marker
from utils.ckpt.write import write_shards
from utils.ckpt.bucket import partials
from utils.ckpt.bucket.remote import delete_step, steps_in
from utils.distributed import broadcast_object, gather_object
from utils.errors import PiconeoxError
from utils.storage import ObjectExists, Storage


class UploadCancelled(PiconeoxError):
    """The uploader was cancelled (a deadline passed) before this upload finished."""


class StepSaver:
    """Writes, uploads, completes and rotates step checkpoints for one rank.

    store: the run's remote folder, or None to only write locally; keep_remote / keep_local: complete checkpoints
    kept in the bucket / on this machine; group: the savers' process group (None in one process); rank: this
    process's global rank; rotate_local: whether this process rotates its machine's step folders; cancel: set
    when the uploader gives up (checked before each file upload). `phase` says what it is doing, for progress bars.
    """

    def __init__(self, store: Storage | None, *, group=None, rank: int = 0, keep_remote: int = 3, keep_local: int = 3,
                 rotate_local: bool = True, cancel: threading.Event | None = None):
        self.store, self.group, self.rank, self.rotate_local = store, group, rank, rotate_local
        self.keep_remote, self.keep_local = keep_remote, keep_local
        self.cancel = cancel or threading.Event()
        self.completed: set[int] = set()  # steps rank 0 confirmed complete (its marker is written)
        self._partials_removed: list[int] = []  # bucket steps the last prune removed as partial (rank 0)
        self.phase = ""

    def save_step(self, snap, folder: Path) -> tuple[str | None, str | None, str]:
        """Every rank: write and upload its files, report to rank 0; rank 0 completes the checkpoint (locally once
        every rank wrote, in the bucket once every rank uploaded). Returns (error, remote url, note), identical on
        every rank."""
        files, failed = {}, None
        try:
            self.phase = f"writing {folder.name}"
            files = manifest(folder, write_shards(snap, folder, self.group))
            if self.store is not None:
                self._upload_own(folder, files)
        except Exception as e:  # reported in any case, or rank 0 would wait for this rank forever
            why = str(e) if isinstance(e, (PiconeoxError, OSError)) else f"{type(e).__name__}: {e}"
            failed = ("upload" if files else "write", why)
        reports = gather_object((failed, files), self.group) if self.group is not None else [(failed, files)]
        outcome = self._complete(snap, folder, reports) if self.rank == 0 else None
        error, url, note = broadcast_object(outcome, self.group) if self.group is not None else outcome
        if error is None or error.startswith("upload"):  # the marker is on disk: complete locally
            self.completed.add(snap.step)
        local = []
        if self.rotate_local:  # also when the upload failed: a bucket that is down must not fill the disk
            rotate(folder.parent, self.keep_local, self.completed)
            local = partials.remove_local(folder.parent, self.completed)
        remote, self._partials_removed = self._partials_removed, []
        if self.rank == 0 and (line := partials.describe(local, remote, folder.parent, self.store and self.store.url)):
            note += f"; {line}"
        return error, url, note

    def _complete(self, snap, folder: Path, reports) -> tuple[str | None, str | None, str]:
        """Rank 0: the marker locally when every rank wrote its files, in the bucket when every rank uploaded
        them too; then prune the bucket."""
        failures = [(rank, failed) for rank, (failed, _) in enumerate(reports) if failed]
        if failures:
            rank, (phase, why) = failures[0]
            where = f" on rank {rank}" if len(reports) > 1 else ""
            more = f" (and on {len(failures) - 1} other rank(s))" if len(failures) > 1 else ""
            error = f"{phase} failed{where}: {why}{more}"
        files = {name: info for _, own in reports for name, info in own.items()}
        if any(phase == "write" for _, (phase, _) in failures):
            return error, None, ""
        write_marker(folder, snap.step, snap.world_size, files)
        if failures:
            return error, None, ""
        if self.store is None:
            return None, None, ""
        try:
            self.phase = f"uploading {folder.name}: {MARKER}"
            url, note = self._upload_marker(folder, files)
            self._prune_remote()
        except (PiconeoxError, OSError) as e:
            return f"upload failed: {e}", None, ""
        return None, url, note

    def _upload_own(self, folder: Path, files: dict) -> None:
        """Upload this rank's files, unless the step is already complete in the bucket (never overwritten)."""
        remote = self.store.child(folder.name)
        if remote.exists(MARKER):
            return
        for i, name in enumerate(files, 1):
            if self.cancel.is_set():
                raise UploadCancelled(f"cancelled before {name}")
            self.phase = f"uploading {folder.name}: {name} ({i}/{len(files)})"
            remote.put(folder / name, name)  # replaces a leftover of an upload cut short (no marker yet)

    def _upload_marker(self, folder: Path, files: dict) -> tuple[str, str]:
        """Rank 0, once every rank uploaded: drop leftovers that are in no manifest, then the marker."""
        remote = self.store.child(folder.name)
        existing = remote.list(checksums=False)
        if MARKER in existing:
            return remote.url, "; it was already complete in the bucket and is kept as is (never overwritten)"
        for name in set(existing) - set(files):  # an older attempt's files (another world size, say)
            remote.delete(name)
        try:
            remote.put(folder / MARKER, MARKER, if_absent=True)
        except ObjectExists:  # another writer finished the same step first: theirs stays
            return remote.url, "; another writer completed it meanwhile, theirs is kept"
        return remote.url, ""

    def _prune_remote(self) -> None:
        """Delete complete remote checkpoints older than the newest `keep_remote` ones (marker first), and the
        partial ones older than the newest complete one (`partials`)."""
        listing = self.store.list(checksums=False)
        self._partials_removed = partials.remove_remote(self.store, listing)
        complete = sorted(step for step, done in steps_in(listing).items() if done)
        for step in complete[:-self.keep_remote]:
            delete_step(self.store, listing, step)
