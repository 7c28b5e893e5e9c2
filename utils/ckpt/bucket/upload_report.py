"""The closing word on --checkpoint-bucket: which checkpoint the bucket holds, and whether the run's newest arrived.

A checkpoint that never reached the bucket is not a success on a machine that can vanish: when the run's newest
complete local checkpoint is not verified in the bucket (gs:// or a directory), the run exits 3
(utils/errors.py) with one line giving the command that uploads it later (utils/push_checkpoint.py).
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from utils.ckpt.format import check_complete, step_dir_name, step_folders
from utils.errors import PiconeoxError
from utils.ckpt.bucket.remote import newest_verified, remote_steps
from utils.storage import Storage


@dataclass
class UploadReport:
    """url: the run's bucket folder; newest_remote: its newest verified step (None: none, or not listable);
    missing: complete local steps the bucket does not hold complete; error: why the bucket could not be listed."""

    url: str
    newest_local: int | None
    newest_remote: int | None
    missing: list[int]
    error: str | None = None

    def summary(self) -> str:
        missing = ", ".join(step_dir_name(s) for s in self.missing)
        if self.error:
            return f"bucket {self.url}: {self.error}; not confirmed there: {missing or 'no local checkpoint'}"
        there = "none" if self.newest_remote is None else step_dir_name(self.newest_remote)
        return f"bucket {self.url}: newest verified checkpoint {there}; " + (
            f"never arrived: {missing}" if missing else "every local checkpoint arrived")

    def newest_missing(self) -> bool:
        return self.newest_local is not None and self.newest_local in self.missing


def upload_report(bucket: Storage, run_dir: Path) -> UploadReport:
    """Compare the complete local step folders of `run_dir` with what `bucket` (the run's folder) holds complete."""
    local = [step for step, folder in step_folders(run_dir) if check_complete(folder) is None]
    newest_local = local[-1] if local else None
    try:
        steps = remote_steps(bucket)
        verified = newest_verified(bucket, steps, warn=lambda _: None)
    except PiconeoxError as e:
        return UploadReport(bucket.url, newest_local, None, local, error=f"cannot list it: {str(e)[:160]}")
    newest_remote = verified[0] if verified else None
    missing = [s for s in local if not steps.get(s)]
    if newest_local is not None and newest_local not in missing and (newest_remote or -1) < newest_local:
        missing.append(newest_local)  # its marker is there, but a file does not match it
    return UploadReport(bucket.url, newest_local, newest_remote, missing)


def finish_command(run_dir: Path, bucket_root: str, credentials: str | None) -> str:
    """The command that uploads the run's newest checkpoint later (utils/push_checkpoint.py), from any folder."""
    script = Path(__file__).resolve().parents[2] / "push_checkpoint.py"  # utils/ckpt/bucket/ -> utils/
    if "://" not in bucket_root:  # a local bucket: relative to this folder, not to wherever the command runs
        bucket_root = str(Path(bucket_root).absolute())
    words = [sys.executable, str(script), str(Path(run_dir).resolve()), "--checkpoint-bucket", bucket_root]
    return shlex.join(words + (["--credentials", str(Path(credentials).absolute())] if credentials else []))


def closing_word(bucket: Storage, run_dir: Path, bucket_root: str, credentials: str | None, log) -> str | None:
    """Log the bucket's summary at the end of a run; return the exit-3 line when the newest checkpoint is not there."""
    report = upload_report(bucket, run_dir)
    (log.warning if report.missing or report.error else log.info)(report.summary())
    if not report.newest_missing():
        return None
    return (f"error: {step_dir_name(report.newest_local)} never reached {report.url}; upload it with: "
            f"{finish_command(run_dir, bucket_root, credentials)}")
