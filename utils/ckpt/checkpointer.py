"""The checkpoint room's one face: train.py talks to utils/ckpt through `Checkpointer` alone.

    ckpt = cleanup.enter_context(Checkpointer.open(settings, name, run_dir, keep_last=3, best_and_final=True,
                                                   accelerator=accelerator, metrics=metrics, log=log))
    resume_from = ckpt.agree(cache)             # rank 0 decides the resume folder, every rank gets it
    cfg, tokenizer_sha256 = ckpt.resumed_config(cfg, data_dir)
    ckpt.attach(model, optimizer, parts, run_config=..., tokenizer=..., optimizer_bytes=...)  # utils/ckpt/parts.py
    ckpt.restore(resume_from)                   # every part back in place
    ckpt.save(step); ckpt.save_best(step)       # only the copy off the device blocks; the saver thread writes
    reason = ckpt.poll(step)                    # every step: a reason to stop after too many failed saves
    code = ckpt.finish(step, ...)               # last save, flush, final/, the closing word; the exit code

The bucket (`store`), the uploader and its saver stay inside: nothing here hands them out. What else train.py
needs of this room is re-exported here, so this module is its one import: the parts (`TrainerState`,
`training_parts`) and this process's RNG (`rng_state` / `set_rng_state`, to rewind a half-done step).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from utils import errors
from utils.ckpt.bucket import partials
from utils.ckpt import resume
from utils.ckpt.format import latest_complete, read_marker, step_dir_name
from utils.ckpt.parts import Part, Registry, TrainerState, training_parts
from utils.ckpt.state import grace_warning, rng_state, set_rng_state
from utils.ckpt.bucket.upload_report import closing_word
from utils.ckpt.save_request import SaveRequest, save_kind
from utils.ckpt.uploader import open_uploader
from utils.ckpt.write import prepare_step_folder, publish_final

__all__ = ["Checkpointer", "Part", "TrainerState", "rng_state", "set_rng_state", "training_parts"]


class Checkpointer:
    """One run's checkpoints: where it resumes from, what each save holds, and how the run's files end.

    settings: configs.run.RunSettings (checkpoint_bucket, credentials, resume, grace_seconds, output_dir, ...).
    metrics: gets `upload/failures` when a save fails; log: the run's logger.
    """

    def __init__(self, settings, run_dir: Path, uploader, *, best_and_final: bool, accelerator, metrics, log):
        self.settings, self.run_dir, self._uploader = settings, Path(run_dir), uploader
        self.best_and_final, self.accelerator, self.metrics, self.log = best_and_final, accelerator, metrics, log
        self.resume_from: Path | None = None
        self.saved_step = 0  # the step of the newest full checkpoint handed to the saver (or resumed from)
        self._registry: Registry | None = None

    @classmethod
    def open(cls, settings, name: str, run_dir: Path, *, keep_last: int, best_and_final: bool, accelerator,
             metrics, log) -> Checkpointer:
        """The bucket and the saver thread, after removing crashes' partial steps; use it as a context manager
        (leaving it flushes and stops the saver on every exit path)."""
        uploader = open_uploader(settings, keep_last, name, accelerator)
        ckpt = cls(settings, run_dir, uploader, best_and_final=best_and_final, accelerator=accelerator,
                   metrics=metrics, log=log)
        uploader.saver.completed |= partials.clean_at_start(accelerator, ckpt.run_dir, uploader.store, log)
        return ckpt

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self._uploader.__exit__(*exc)

    @property
    def saver_group(self):
        """The savers' gloo process group (for the timeouts line), None in one process."""
        return self._uploader.group

    # --- start ----------------------------------------------------------------------------------------------

    def agree(self, cache: Path) -> Path | None:
        """The folder this rank resumes from (None: start fresh); rank 0 decides, each machine fetches once into
        `cache`, its own folder for checkpoints from a bucket (utils.run.allocation.machine_folder)."""
        s = self.settings
        self.resume_from = resume.agree(self.accelerator, s.resume, self.run_dir, self._uploader.store, cache,
                                        s.credentials, s.grace_seconds, self.log)
        return self.resume_from

    def resumed_config(self, cfg, data_dir: Path):
        """(`cfg` with its batch for this world size, the dataset's tokenizer sha256): a resume refuses another
        model shape or tokenizer and keeps the checkpoint's tokens per step."""
        return resume.resumed_config(cfg, self.resume_from, self.accelerator.num_processes, data_dir)

    def attach(self, model, optimizer, parts: dict[str, Part], *, run_config: dict, tokenizer, optimizer_bytes: int,
               published: str | None = None) -> None:
        """What every save holds: the unwrapped `model` and torch `optimizer` (DCP shards) and the `parts`;
        `optimizer_bytes`: the optimizer's whole state (utils.optim.state_bytes), for the grace's start-up check;
        `published`: the sharded part best/ and final/ take their weights from (None: the model's)."""
        acc = self.accelerator
        self._registry = Registry(model, optimizer, parts, run_config=run_config, tokenizer=tokenizer,
                                  rank=acc.process_index, world_size=acc.num_processes, published=published)
        save_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) + optimizer_bytes
        if acc.is_main_process and (note := grace_warning(save_bytes, acc.num_processes, self.settings.grace_seconds,
                                                          self._uploader.store is not None)):
            self.log.warning(note)

    def restore(self, folder: Path) -> None:
        """Every part back as `folder` holds it (every rank: the sharded load is a collective)."""
        self._registry.load(folder)
        self.saved_step = int(read_marker(folder)["step"])

    # --- during the run -------------------------------------------------------------------------------------

    def step_folder(self, step: int) -> Path:
        return self.run_dir / step_dir_name(step)

    def latest(self) -> Path | None:
        """The newest complete local checkpoint, for messages."""
        return latest_complete(self.run_dir)

    def save(self, step: int, here: bool = False) -> None:
        """A full step checkpoint; only the copy of this rank's shard off the device blocks (`here`: all of it,
        written on this thread: a stop's save)."""
        folder = self.step_folder(step)
        self.saved_step = step
        if self.accelerator.is_local_main_process:
            prepare_step_folder(folder)  # an interrupted earlier save of this step; before any rank writes
        self._submit(step, folder, weights_only=False, here=here)

    def save_best(self, step: int) -> None:
        """best/: the published weights (gathered onto rank 0), tokenizer and small states."""
        self._submit(step, self.run_dir / "best", weights_only=True)

    def _submit(self, step: int, folder: Path, weights_only: bool, here: bool = False) -> None:
        kept = self.accelerator.is_main_process or not weights_only  # best/: the weights are gathered onto rank 0
        if kept and self._uploader.background and not here:  # the slot first: a capture waiting for it would hold a
            # third copy
            self._uploader.wait_for_slot(folder.name, save_kind(weights_only))
        start = time.monotonic()
        snapshot = self._registry.capture(step, weights_only=weights_only)
        (self.log.info if self.accelerator.is_main_process else self.log.debug)(
            f"checkpoint {folder.name}: training blocked {time.monotonic() - start:.3f} s copying its state")
        if kept:
            self._uploader.submit(SaveRequest(snapshot, folder, weights_only), here=here)

    def poll(self, step: int) -> str | None:
        """Log and count finished saves; after too many failures in a row, the reason to stop (else None)."""
        if any(not result.ok for result in self._uploader.poll()):
            self.metrics.scalars(step, {"upload/failures": self._uploader.failures})
        return self._uploader.fatal

    # --- the end --------------------------------------------------------------------------------------------

    @property
    def phase(self) -> str:
        """What the saver is doing now ("writing step-00000100", "uploading ..."), "" when idle."""
        return self._uploader.saver.phase

    def finish(self, step: int, *, consolidate: bool, timeout: Callable[[], float | None],
               meanwhile: Callable[[], object] = lambda: None) -> int:
        """Save `step` unless saved, run `meanwhile` while the saves flush (at most `timeout()` s), publish
        final/ (its weights consolidated unless not `consolidate`: no time on a signal, and the save is written
        on this thread, at the run's own priority) and say what reached the bucket. Returns the exit code: 0; 3
        when the newest checkpoint is not in the bucket; 2 after too many failed saves (each with its one `error:`
        line recorded)."""
        if self.saved_step != step:  # breaks (early stop, signal) can come before a due save
            self.save(step, here=not consolidate)
        meanwhile()
        self._uploader.close(timeout=timeout())  # every rank's saver
        fatal = self.poll(step)
        not_uploaded = None
        if self.accelerator.is_main_process:
            if self.best_and_final and step > 0:  # stopped before its first step: nothing to publish
                publish_final(self.step_folder(step), self.run_dir / "final", consolidate_weights=consolidate,
                              log=self.log, weights=self._registry.published)
            if self._uploader.store is not None:
                not_uploaded = closing_word(self._uploader.store, self.run_dir, self.settings.checkpoint_bucket,
                                            self.settings.credentials, self.log)
        if not_uploaded:
            return errors.finish(errors.NOT_UPLOADED, not_uploaded)
        return errors.finish(errors.REFUSED, f"error: {fatal}") if fatal else errors.DONE
