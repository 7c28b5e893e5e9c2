"""Run settings: where a run writes, what it resumes or starts from, and how it talks to a bucket.

Settable as flags (`--resume auto`), in a `--config-file` YAML `run:` section, or with `--set run.KEY=VALUE`;
recorded in every checkpoint's run_config.json (the credentials path only as "<set>").
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from configs.base import ConfigBase
from utils.errors import PiconeoxError


MAX_SAMPLE_TOKENS = 1000


@dataclass(frozen=True)
class RunSettings(ConfigBase):
    """Everything about a run that is not the model or the training recipe."""

    SECTION = "run"

    run_name: str | None = None
    """Folder name under output_dir and log_dir (default: <preset>-<dataset>): letters, digits, '.', '_', '-'."""
    output_dir: str = "checkpoints"
    """Root of checkpoints/<run>/."""
    log_dir: str = "logs"
    """Root of logs/<run>/ (training.log, history.json, loss.png, tracker files)."""
    resume: str | None = None
    """`auto` (the newest complete checkpoint of this run, local or in checkpoint_bucket, if any), a checkpoint or
    run folder, or gs:// or s3://bucket/prefix/<run>[/step-XXXXXXXX]."""
    init_from: str | None = None
    """A local GPT-NeoX checkpoint in Hugging Face format (a downloaded Pythia, or checkpoints/<run>/final): its
    weights, tokenizer and model shape; a fresh optimizer."""
    checkpoint_bucket: str | None = None
    """Also upload checkpoints to <this>/<run>/step-XXXXXXXX/ (gs:// or s3://bucket/prefix, or a directory)."""
    credentials: str | None = None
    """Service-account JSON key for gs:// (default: GOOGLE_APPLICATION_CREDENTIALS or the gcloud login); s3:// reads
    AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, and AWS_ENDPOINT_URL for R2 or MinIO."""
    background_upload: bool = True
    """Write and upload checkpoints on a background thread; false: synchronously, inside the step that saves."""
    max_upload_failures: int = 3
    """Stop (exit 2) after this many failed checkpoint saves or uploads in a row."""
    grace_seconds: float = 30.0
    """On SIGTERM/SIGINT: save, flush uploads and exit 0 within this many seconds; also each storage call's limit."""
    collective_timeout_minutes: float = 60.0
    """How long a rank waits for the others in a collective before the run fails, until step 1 is done (covers a
    resume download, the compile and a synchronous save of the 1.2B preset)."""
    rendezvous_timeout_seconds: float = 900.0
    """How long a process waits for the other processes of its group to start (torch's rendezvous default); a
    Ctrl-C or SIGTERM ends the wait at once. start_training.sh's flag of the same name bounds the machines' wait."""
    step_timeout_minutes: float = 10.0
    """The collective timeout from step 2 on, and the stop vote's: a hung rank idles the other GPUs this long."""
    report_to: str = "tensorboard"
    """Trackers for every logged value, comma-separated: tensorboard, wandb, mlflow, ... (accelerate's), or none."""
    sample_prompt: str = "Once upon a time"
    """Prompt of the text sample logged at the end of the run."""
    sample_tokens: int = 200
    """Tokens of that sample, at most 1000 (each token is a forward over the whole context); 0: no sample (it is most of
    a short run's finish: 0.25 of 0.42 CPU seconds of a 2-step run of the test preset)."""

    def validate(self, keep_last: int) -> RunSettings:
        """Every check that needs no file or bucket, each one line naming the flag; `keep_last` is train.keep_last."""
        from utils.ckpt.bucket.remote import check_upload_settings
        from utils.distributed import check_timeout
        from utils.run.preemption import check_grace_seconds
        from utils.run.rendezvous import check_rendezvous_timeout
        from utils.storage import check_location
        from utils.report.trackers import parse_report_to

        for key in ("output_dir", "log_dir"):  # "" would write into the current folder
            if not str(getattr(self, key)).strip():
                raise PiconeoxError(f"run.{key} is empty: give a value, or leave it out for its default "
                                    f"({getattr(RunSettings, key)!r})")
        self.check_ints(("sample_tokens",), 0)
        if self.sample_tokens > MAX_SAMPLE_TOKENS:  # each token is a forward over the whole context (no cache)
            raise PiconeoxError(f"--sample-tokens {self.sample_tokens}: at most {MAX_SAMPLE_TOKENS} (the end of a "
                                "run shows a glimpse; `python -m utils.generate CHECKPOINT --max-new-tokens N` writes "
                                "more)")
        check_timeout(self.collective_timeout_minutes)
        check_timeout(self.step_timeout_minutes, "--step-timeout-minutes", 10)
        check_grace_seconds(self.grace_seconds)
        check_rendezvous_timeout(self.rendezvous_timeout_seconds)
        check_upload_settings(bool(self.checkpoint_bucket), keep_last, self.max_upload_failures)
        parse_report_to(self.report_to)
        check_location(self.checkpoint_bucket)  # a bad bucket name is one line before any launch
        if self.resume != "auto":
            check_location(self.resume)
        return self

    def folders(self, default_name: str) -> tuple[str, Path, Path]:
        """(run name, output_dir/<run>, log_dir/<run>); refuses a run name that is not a plain folder name."""
        name = self.run_name or default_name
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise PiconeoxError(f"--run-name {name!r} is not allowed: use letters, digits, '.', '_' and '-'")
        return name, Path(self.output_dir) / name, Path(self.log_dir) / name

    def recorded(self) -> dict:
        """The settings as run_config.json and the trackers record them: the key file's path is not shown."""
        return {**asdict(self), "credentials": "<set>" if self.credentials else None}
