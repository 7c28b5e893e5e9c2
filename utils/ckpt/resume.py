"""Where a run resumes from: rank 0 decides once, every machine then fetches exactly that checkpoint.

Only rank 0's machine holds the COMPLETE markers (other machines hold their own shards), and a fresh machine
holds nothing: so each machine choosing from its own disk would start ranks at different steps. Instead:

1. rank 0 lists the candidates (`candidates`): for `--resume auto` its newest verified local checkpoint and
   the bucket's newest complete one; for a path or gs:// URL, that checkpoint. Their markers (every file's
   size and crc32c) go to all ranks.
2. each machine says which candidates it can get (`obtainable`); the newest that every machine can get wins
   (a step whose marker rank 0 wrote but whose upload was cut short exists only on rank 0's machine).
3. one process per machine (`fetch`) uses its local copy of that step when every file matches the marker,
   else downloads the step from the bucket (crc32c-checked); every rank learns its machine's folder, and any
   machine's failure stops every rank with the same line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from utils.ckpt import format as ckpt
from utils.ckpt.bucket import remote
from utils.data.shards import verify_dataset
from utils.distributed import all_gather_object, rank0_decides
from utils.errors import PiconeoxError
from utils.storage import Storage, StorageError, is_remote, open_storage


@dataclass
class ResumePoint:
    """The checkpoint every rank resumes from.

    local: a folder each machine checks first (its run dir's step folder, or the --resume path).
    remote: the bucket folder of the run (holding step-XXXXXXXX/) to download from when the local copy is
    missing or damaged; None when the bucket does not hold this step complete.
    """

    step: int
    marker: dict
    local: str | None
    remote: str | None


def candidates(resume: str | None, run_dir: Path, bucket: Storage | None, credentials: str | None,
               timeout_s: float, warn: Callable[[str], object]) -> list[ResumePoint]:
    """Rank 0: the checkpoints to resume from, newest first; empty to start fresh (see the module docstring).

    For `--resume auto` these are rank 0's newest verified local checkpoint and the bucket's newest complete
    one: `agree` takes the first that every machine can get.
    """
    if not resume:
        return []
    if is_remote(resume):
        try:
            store, step = remote.resolve_url(resume, credentials, timeout_s=timeout_s)
            return [ResumePoint(step, remote.remote_marker(store, step), None, store.url)]
        except StorageError as e:  # unreachable, or credentials it refuses: name the flag
            raise PiconeoxError(f"--resume {resume}: {e}") from None
    if resume != "auto":
        folder = ckpt.find_checkpoint(resume, resume=True, flag="--resume ", warn=warn)
        marker = ckpt.read_marker(folder)
        return [ResumePoint(int(marker["step"]), marker, str(folder), None)]
    steps, verified = {}, None
    if bucket is not None:
        try:
            steps = remote.remote_steps(bucket)
            verified = remote.newest_verified(bucket, steps, warn)  # a damaged newer step is skipped, as locally
        except PiconeoxError as e:
            warn(f"--resume auto: could not list {bucket.url}, using local checkpoints only: {e}")
    points = []
    local = ckpt.latest_complete(run_dir, warn)
    if local is not None:
        marker = ckpt.read_marker(local)
        remote_url = bucket.url if steps.get(marker["step"]) else None
        points.append(ResumePoint(int(marker["step"]), marker, str(local), remote_url))
    if verified is not None and not any(p.step == verified[0] for p in points):
        step, marker = verified
        points.append(ResumePoint(step, marker, str(Path(run_dir) / ckpt.step_dir_name(step)), bucket.url))
    return sorted(points, key=lambda p: -p.step)


def obtainable(point: ResumePoint) -> bool:
    """Whether this machine can get `point`: from the bucket, or its own copy has every file (sizes checked)."""
    return point.remote is not None or (
        point.local is not None and Path(point.local).is_dir()
        and ckpt.check_files(Path(point.local), point.marker["files"], verify=False) is None)


def fetch(point: ResumePoint, cache_root: Path, credentials: str | None, timeout_s: float, verify: bool = True) -> Path:
    """This machine's complete copy of `point`: the local folder when every file matches the marker (crc32c
    too when `verify`), else a download from the bucket."""
    reason = f"{point.local} is missing"
    if point.local and Path(point.local).is_dir():
        reason = ckpt.check_files(Path(point.local), point.marker["files"], verify)
        if reason is None:
            return Path(point.local)
    if point.remote is None:
        raise PiconeoxError(f"cannot resume from step {point.step} on this machine: {reason}, and no "
                            "--checkpoint-bucket holds it (several machines need a bucket or a shared filesystem)")
    store = open_storage(point.remote, credentials, timeout_s=timeout_s)
    folder = remote.download_checkpoint(store, point.step, remote.cache_dir_for(store.url, cache_root))
    reason = ckpt.check_files(folder, point.marker["files"], verify=True)
    if reason:
        raise PiconeoxError(f"downloaded {store.url}/{ckpt.step_dir_name(point.step)}, but {reason}")
    return folder


def agree(accelerator, resume: str | None, run_dir: Path, bucket: Storage | None, cache_root: Path,
          credentials: str | None, timeout_s: float, log) -> Path | None:
    """The folder this rank resumes from (None: start fresh); rank 0 decides, each machine fetches once."""
    def decide() -> list[ResumePoint]:
        points = candidates(resume, run_dir, bucket, credentials, timeout_s, log.warning)
        if not points and resume == "auto":
            log.info(f"--resume auto: no complete checkpoint in {run_dir}{f' or {bucket.url}' if bucket else ''}; "
                     "starting fresh")
        return points

    points = rank0_decides(decide, accelerator.is_main_process)
    if not points:
        return None
    machines = [c for c in all_gather_object([obtainable(p) for p in points] if accelerator.is_local_main_process
                                                 else None) if c is not None]
    usable = [i for i in range(len(points)) if all(c[i] for c in machines)]
    if not usable:
        raise PiconeoxError(f"cannot resume from step {points[0].step}: another machine lacks its files and no "
                            "--checkpoint-bucket holds it (several machines need a bucket or a shared filesystem)")
    point = points[usable[0]]
    if usable[0] > 0:
        log.warning(f"--resume auto: step {points[0].step} is complete only on rank 0's machine (not yet in the "
                    "bucket); "
                    f"resuming from step {point.step}, which every machine can get")
    folder, error = None, None
    if accelerator.is_local_main_process:
        try:  # rank 0 checked every crc32c of its own copy while deciding
            folder = str(fetch(point, cache_root, credentials, timeout_s, verify=not accelerator.is_main_process))
        except PiconeoxError as e:
            error = f"rank {accelerator.process_index}: {e}"
    results = all_gather_object((folder, error))
    errors = [e for _, e in results if e]
    if errors:
        raise PiconeoxError(errors[0])
    return Path(results[accelerator.process_index - accelerator.local_process_index][0])


def check_resumable(saved: dict | None, resume_from, model: dict, data_dir: Path) -> str:
    """Refuse a checkpoint of another model shape (`model`: this run's model settings) or tokenizer; return the
    dataset's tokenizer sha256. `saved` is the checkpoint's run_config.json."""
    if saved:
        now = model
        diff = next((k for k in saved["model"] if saved["model"][k] != now.get(k)), None)
        if diff:
            raise PiconeoxError(f"--resume {resume_from}: checkpoint has model.{diff}={saved['model'][diff]!r}, "
                                f"this run has {now[diff]!r}")
    expected = saved.get("data_tokenizer_sha256") if saved else None
    return verify_dataset(data_dir, expected_tokenizer_sha256=expected).tokenizer_sha256


def batch_for_world(tc, world: int, saved: dict | None, trainer: dict | None):
    """The recipe's batch on `world` processes; a resume keeps the checkpoint's tokens per step (older
    checkpoints without train.global_batch_tokens tell it by tokens seen per step)."""
    fixed = None
    if saved:
        fixed = saved["train"].get("global_batch_tokens") or (
            trainer["tokens_seen"] // trainer["step"] if trainer["step"] else None)
    return tc.for_world(world, fixed_global_batch=fixed)


def resumed_config(cfg, resume_from: Path | None, world: int, data_dir: Path):
    """(`cfg`, a configs RunConfig, with its batch for this world size; the dataset's tokenizer sha256): a resume
    refuses another model shape or tokenizer and keeps the checkpoint's tokens per step."""
    from dataclasses import replace

    from utils.ckpt.load import read_part

    from utils.ckpt.ranges import batch_problem

    saved = read_part(resume_from, "run_config") if resume_from else None
    trainer = read_part(resume_from, "trainer") if resume_from else None
    if saved is not None:
        where = f"{resume_from}/run_config.json: not a run_config a run writes"
        if not all(isinstance(saved.get(k), dict) for k in ("model", "train")):
            raise PiconeoxError(f"{where}: it needs model and train sections")
        if why := batch_problem(saved, trainer if isinstance(trainer, dict) else None):
            raise PiconeoxError(f"{where}: {why}")
    tokenizer_sha256 = check_resumable(saved, resume_from, cfg.model.to_dict(), data_dir)
    return replace(cfg, train=batch_for_world(cfg.train, world, saved, trainer)), tokenizer_sha256
