"""Checkpoints persisted off the training thread: the queue and the saver thread (utils/ckpt/saver.py does a save).

The training thread only copies its shard off the device (`Registry.capture`) and hands the snapshot to
`submit()`; one non-daemon thread per rank then writes, uploads and completes it. With `background=False` the
same work runs inside `submit()` (`--no-background-upload`). best/ (weights only, rank 0) is written locally only.

    uploader = open_uploader(settings, keep_last, run_name, accelerator)   # or CheckpointUploader(store, ...)
    uploader.submit(SaveRequest(registry.capture(step), run_dir / "step-00000100"))
    for result in uploader.poll(): ...      # every step: outcomes are logged and counted here
    uploader.close()                        # every exit path: flush with a progress bar

Bounded memory: one request in flight and at most one queued per kind (full step checkpoint, weights-only
best/): a newer request waits for the queued one of its kind to start, so when saving is slower than
--save-every the training waits (and says so) instead of dropping checkpoints. Never silent: each outcome
reaches the training thread through `poll()`, which logs it (rank 0) and counts failures; every rank gets the
same outcome, so `fatal` is set at the same save everywhere.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict

import torch
from tqdm.auto import tqdm

from utils.ckpt.write import write_weights
from utils.ckpt.bucket.remote import check_upload_settings
from utils.ckpt.save_request import SaveRequest, SaveResult
from utils.ckpt.saver import StepSaver
from utils.diskfull import NO_SPACE
from utils.errors import PiconeoxError, peer_gone
from utils.storage import Storage

log = logging.getLogger("piconeox")


class CheckpointUploader:
    """Writes and uploads checkpoints on one background thread; see the module docstring.

    store: the run's remote folder (`open_storage(bucket).child(run)`), or None to only write locally.
    keep_remote: complete remote checkpoints to keep (>= 2, so a fallback always exists).
    keep_local: complete local step folders to keep (`rotate`).
    max_failures: failures in a row after which `fatal` is set (>= 1).
    background: False runs each save inside `submit()`.
    group: the savers' gloo process group (`distributed.cpu_group()`), None in a single process.
    rank: this process's global rank; rotate_local: whether this process rotates its machine's step folders.
    """

    def __init__(self, store: Storage | None, *, keep_remote: int = 3, keep_local: int = 3, max_failures: int = 3,
                 background: bool = True, progress: bool = True, group=None, rank: int = 0, rotate_local: bool = True,
                 device: torch.device | None = None):
        check_upload_settings(store is not None, keep_remote, max_failures)
        self.store, self.group, self.rank, self.max_failures = store, group, rank, max_failures
        self._cancel = threading.Event()
        self.saver = StepSaver(store, group=group, rank=rank, keep_remote=keep_remote, keep_local=keep_local,
                               rotate_local=rotate_local, cancel=self._cancel)
        self.background, self.progress = background, progress
        self.failures = 0  # in total
        self.consecutive_failures = 0
        self.fatal: str | None = None  # set by poll() once max_failures failures came in a row
        self._cond = threading.Condition()
        self._queue: OrderedDict[str, SaveRequest] = OrderedDict()
        self._in_flight: SaveRequest | None = None
        self._results: list[SaveResult] = []
        self._closed = False
        self._thread = None
        # the run's GPU, for the thread; None on a CPU run, even on a GPU box (asking torch would open a context)
        cuda = device is not None and device.type == "cuda"
        self._cuda_device = (torch.cuda.current_device() if device.index is None else device.index) if cuda else None
        if background:
            # Non-daemon: an interpreter exit waits for the upload instead of killing it half-way.
            self._thread = threading.Thread(target=self._run, name="checkpoint-uploader", daemon=False)
            self._thread.start()

    # --- training thread -------------------------------------------------------------------------------

    def submit(self, request: SaveRequest, here: bool = False) -> None:
        """Persist `request`: queued for the thread (after a queued one of its kind), or now on this thread."""
        if self._closed:
            raise RuntimeError("submit() after close()")
        if not self.background or here:  # here: a stop's save, at this thread's priority (the saver's nice +10 stays)
            self.flush()
            (log.info if here and self.progress else log.debug)(f"writing {request.folder.name}")
            self._results.append(self._persist(request))
            return
        self.wait_for_slot(request.folder.name, request.kind)
        with self._cond:
            self._queue[request.kind] = request
            self._cond.notify_all()

    def wait_for_slot(self, name: str, kind: str) -> None:
        """Back-pressure, before the state is captured: wait while a save of `kind` still waits in the queue, so at
        most one snapshot is being written and one queued (one staging set, a second while a write lags)."""
        start = time.monotonic()
        with self._cond:
            while kind in self._queue:  # the queued one must start first
                self._cond.wait()
        waited = time.monotonic() - start
        if waited > 0.1:
            log.warning(f"training waited {waited:.1f} s to queue checkpoint {name}: saving is slower than "
                        "--save-every")

    def poll(self) -> list[SaveResult]:
        """Outcomes finished since the last call: logged, failures counted, `fatal` set after too many in a row."""
        with self._cond:
            results, self._results = self._results, []
        report = log.info if self.rank == 0 else log.debug  # every rank got the same outcome; rank 0 says it
        for r in results:
            if r.ok:
                if r.uploaded_to or self.store is None:  # a best/ save says nothing about the bucket
                    self.consecutive_failures = 0
                where = f", uploaded to {r.uploaded_to}" if r.uploaded_to else ""
                report(f"saved checkpoint {r.folder}{where} ({r.seconds:.1f} s){r.note}")
                continue
            self.failures += 1
            self.consecutive_failures += 1
            (log.error if self.rank == 0 else log.debug)(
                f"checkpoint {r.folder}: {r.error} ({self.consecutive_failures} failure(s) in a row, "
                f"{self.failures} in total; fatal at {self.max_failures})")
            if NO_SPACE in r.error and self.fatal is None:  # retrying cannot help: stop now, keep the last one
                self.fatal = f"{r.error}; the last complete checkpoint is kept"
            if self.consecutive_failures >= self.max_failures and self.fatal is None:
                self.fatal = (f"{self.consecutive_failures} checkpoint saves failed in a row (--max-upload-failures "
                              f"{self.max_failures}); last: {r.error}")
        return results

    def pending(self) -> int:
        """Requests queued or in flight."""
        with self._cond:
            return len(self._queue) + (self._in_flight is not None)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted save is finished, with a progress bar; False if `timeout` s passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            total = len(self._queue) + (self._in_flight is not None)
            if not total:
                return True
            with tqdm(total=total, desc="flush checkpoints", unit="ckpt", disable=not self.progress,
                      dynamic_ncols=True) as bar:
                while (left := len(self._queue) + (self._in_flight is not None)):
                    bar.n = total - left
                    bar.set_postfix_str(self.saver.phase)
                    wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                    if wait <= 0:
                        return False
                    self._cond.wait(wait)
                bar.n = total
                bar.set_postfix_str("done")
        return True

    def cancel(self) -> None:
        """Drop queued saves and stop the one in flight before its next file (the remote keeps its previous
        complete checkpoint: the marker of the cut upload never arrives)."""
        with self._cond:
            dropped = [r.folder.name for r in self._queue.values()]
            self._queue.clear()
            self._cond.notify_all()
        self._cancel.set()
        if dropped:
            log.error(f"dropped unsaved checkpoint(s) {', '.join(dropped)}")

    def close(self, timeout: float | None = None) -> bool:
        """Flush (at most `timeout` s) and stop the thread; False if work was cut off. `poll()` reports the outcomes.

        After a timeout the save in flight is cancelled; the thread is not daemon, so the process still
        ends only after its current file transfer returns (each storage call is bounded by its timeout).
        """
        if self._closed:
            return True
        finished = self.flush(timeout)
        if not finished:
            in_flight = self._in_flight
            self.cancel()
            log.error(f"checkpoint {in_flight.folder.name if in_flight else ''} was still saving when the time "
                      f"ran out ({self.saver.phase}); the bucket keeps its previous complete checkpoint")
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if finished and self._thread is not None:
            self._thread.join()
        return finished

    def __enter__(self) -> CheckpointUploader:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # A KeyboardInterrupt here is a second Ctrl-C: the user wants out now, not after the upload.
        self.close(timeout=0 if exc_type is KeyboardInterrupt else None)
        self.poll()

    # --- background thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        # Linux: a lower CPU priority for this thread only, so writing and hashing take idle cycles, not the step's.
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        if self._cuda_device is not None:
            # Freeing a pinned snapshot touches CUDA: on a thread without a device that opens a context on GPU 0,
            # ~0.5 GiB of every rank's memory there (PyTorch's pin-memory thread sets it for the same reason).
            torch.cuda.set_device(self._cuda_device)
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                _, request = self._queue.popitem(last=False)
                self._in_flight = request
                self._cond.notify_all()  # a submit() may be waiting for this slot
            result = self._persist(request)
            del request  # the staged snapshot goes now: its buffers (Stager) can take the next save, no second set
            with self._cond:
                self._results.append(result)
                self._in_flight = None
                self.saver.phase = ""
                self._cond.notify_all()

    def _persist(self, request: SaveRequest) -> SaveResult:
        """Write (and upload, prune, rotate) one checkpoint; any failure becomes the result's error."""
        start = time.monotonic()
        result = SaveResult(request.folder, request.snapshot.step)
        try:
            if request.weights_only:
                self.saver.phase = f"writing {request.folder.name}"
                write_weights(request.snapshot, request.folder)
            else:
                result.error, result.uploaded_to, result.note = self.saver.save_step(request.snapshot, request.folder)
        except (PiconeoxError, OSError) as e:
            result.error = f"write failed: {e}"
        except Exception as e:  # a bug must still reach poll(), not kill the thread and hang flush()
            result.error = f"write failed: {peer_gone(e) or f'{type(e).__name__}: {e}'}"
        result.seconds = time.monotonic() - start
        return result


def open_uploader(settings, keep_last: int, name: str, accelerator) -> CheckpointUploader:
    """A run's uploader (`settings`: configs.run.RunSettings): every rank saves its own shard on its own thread,
    rank 0 completes each checkpoint; each storage call gives up within one grace period, so a dead bucket cannot
    hold a clean stop for long, and the savers' group times out like the run's start-up collectives."""
    from datetime import timedelta

    from utils.distributed import cpu_group
    from utils.storage import open_storage

    s = settings
    bucket = open_storage(s.checkpoint_bucket, s.credentials, timeout_s=s.grace_seconds).child(name) \
        if s.checkpoint_bucket else None
    return CheckpointUploader(bucket, keep_remote=keep_last, keep_local=keep_last, max_failures=s.max_upload_failures,
                              background=s.background_upload, progress=accelerator.is_main_process,
                              # a save may wait on another rank's slow upload: the start-up collective timeout (which
                              # also covers a synchronous save) bounds it, so a dead rank fails the save
                              group=cpu_group(timedelta(minutes=s.collective_timeout_minutes)),
                              rank=accelerator.process_index, rotate_local=accelerator.is_local_main_process,
                              device=accelerator.device)
