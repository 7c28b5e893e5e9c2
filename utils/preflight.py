"""Before the launch (`train.py --preflight`, once per machine, no GPU): every check that needs files, folders
or credentials, so a mistake is one line before any process starts; then a gs:// --data synced to this machine."""
from __future__ import annotations

from pathlib import Path

from utils.errors import PiconeoxError


def preflight(cfg, pretrained, folders: tuple[str, Path, Path], processes: int | None = None) -> Path | None:
    """Check output folders, --data, --init-from, --resume and gs:// credentials (configs/run.py checked the rest;
    `cfg` is a configs RunConfig, `folders` its (run name, run dir, log dir)), then sync a gs:// --data into this
    machine's cache and return that folder (None for local data)."""
    from utils.ckpt.format import find_checkpoint
    from utils.data.shards import verify_dataset
    from utils.data.source import DATA_CACHE, check_data_arg, ensure_local
    from utils.report.trackers import check_wandb_login, parse_report_to
    from utils.run import runlock
    from utils.run.run_folders import check_new_run
    from utils.storage import is_remote

    if (local := check_data_arg(cfg.train)) is not None:
        dataset = verify_dataset(local)  # hashes the shards on first use; the launched run then finds them cached
        if pretrained:
            pretrained.check_dataset(local, dataset.tokenizer_sha256)
    if processes is not None and processes < 1:
        raise PiconeoxError(f"--processes {processes}: must be at least 1")
    if processes and not cfg.run.resume:  # known now: a resume keeps its checkpoint's global batch
        cfg.train.for_world(processes)
    s = cfg.run
    name, run_dir, log_dir = folders
    with runlock.for_launcher(s.output_dir, name, s.log_dir):  # held for the run unless a check here refuses it
        check_new_run(s.resume, run_dir, log_dir)
        if "wandb" in parse_report_to(s.report_to):
            check_wandb_login()  # caught here, not after the model is built
        if s.credentials or any(is_remote(u) for u in (cfg.train.data, s.checkpoint_bucket, s.resume)):
            from utils.storage.gcs import resolve_credentials  # the Google clients only where gs:// is used

            resolve_credentials(s.credentials)  # the key loads; no bucket is read
        if s.resume and s.resume != "auto" and not is_remote(s.resume):
            find_checkpoint(s.resume, resume=True, flag="--resume ", warn=lambda _: None)
    return ensure_local(cfg.train.data, DATA_CACHE, s.credentials) if is_remote(cfg.train.data) else None
