"""piconeox trainer: one GPT-NeoX training loop from a 10K-parameter Pico model to the 1.2B preset.

    accelerate launch train.py --config rp2040-speed          (or ./start_training.sh --config ... --gpus N)

Read top to bottom: parse flags -> resolve config -> data -> model/optimizer -> prepare -> resume -> loop
(micro-steps, optimizer step, log, eval, save) -> final save -> sample text.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path

from utils import exit_status
from utils.errors import CliParser, PiconeoxError
from utils.run_folders import RunClaim, check_new_run, keep_earlier_best


def parse_args(argv=None) -> argparse.Namespace:
    from configs.presets import PRESET_NAMES

    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="test", help=f"preset name ({', '.join(PRESET_NAMES)})")
    p.add_argument("--config-file", help="YAML file with `model:` and/or `train:` sections overriding the preset")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override any setting, e.g. --set model.num_layers=6 (repeatable)")
    p.add_argument("--data", help="prepared dataset dir, gs://bucket/prefix of one, or `demo`")
    p.add_argument("--run-name", help="run name (default: <preset>-<dataset>)")
    p.add_argument("--output-dir", default="checkpoints", help="root of checkpoints/<run>/ (default: checkpoints)")
    p.add_argument("--log-dir", default="logs", help="root of logs/<run>/ (default: logs)")
    p.add_argument("--resume", help="`auto` (latest complete checkpoint of this run, local or in --checkpoint-bucket, "
                   "if any), a checkpoint/run path, or gs://bucket/prefix/<run>[/step-XXXXXXXX]")
    p.add_argument("--print-plan", action="store_true", help="print parameters, batch, tokens and memory per GPU, then exit")
    p.add_argument("--preflight", action="store_true", help="only check the settings, --data, --resume and gs:// settings, "
                   "sync a gs:// --data into data/gcs-cache/<host>/ and print that folder, then exit (start_training.sh "
                   "runs this first, once per machine: a mistake costs one line, and no rank waits for a download)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs assumed by --print-plan (default 1)")
    p.add_argument("--processes", type=int, metavar="N", help="with --preflight: the training processes the launch starts "
                   "(the global batch must divide over them; start_training.sh passes it)")
    p.add_argument("--no-background-upload", action="store_true", help="write and upload checkpoints synchronously")
    p.add_argument("--checkpoint-bucket", metavar="URL", help="also upload checkpoints to URL/<run>/step-XXXXXXXX/ (gs://bucket/prefix or a directory)")
    p.add_argument("--credentials", metavar="FILE", help="service-account JSON key for gs:// (default: GOOGLE_APPLICATION_CREDENTIALS or gcloud login)")
    p.add_argument("--max-upload-failures", type=int, default=3, metavar="N", help="stop (exit 2) after N failed checkpoint saves/uploads in a row (default 3)")
    p.add_argument("--grace-seconds", type=float, default=30.0, metavar="S", help="on SIGTERM/SIGINT: save, flush uploads and exit 0 within S seconds (default 30)")
    p.add_argument("--collective-timeout-minutes", type=float, default=60.0, metavar="M",
                   help="how long a rank waits for the others in a collective before the run fails (default 60: "
                        "covers a resume download, the compile and a synchronous save of the 1.2B preset)")
    p.add_argument("--step-timeout-minutes", type=float, default=10.0, metavar="M",
                   help="the collective timeout from step 2 on, and the stop vote's (default 10): a hung rank "
                        "idles the other GPUs this long, not --collective-timeout-minutes")
    p.add_argument("--init-from", metavar="PATH", help="start from a local GPT-NeoX checkpoint in Hugging Face format (a "
                   "downloaded Pythia, or checkpoints/<run>/final): its weights, tokenizer and model shape; fresh optimizer")
    p.add_argument("--report-to", default="tensorboard", metavar="T1,T2", help="trackers for every logged value: "
                   "tensorboard (default), wandb, mlflow, ... (accelerate's), comma-separated, or none")
    p.add_argument("--sample-prompt", default="Once upon a time", help="prompt for the text sample printed at the end")
    # Shortcuts for the most used train.* settings (same as --set train.KEY=VALUE).
    for flag, key in SHORTCUTS.items():
        p.add_argument(flag, dest=key, default=None, help=f"= --set train.{key}=VALUE")
    p.epilog = "--batch-size auto: the largest micro batch whose forward/backward fits on the GPU (CUDA only)."
    return p.parse_args(argv)


SHORTCUTS = {
    "--max-steps": "max_steps", "--max-training-hours": "max_training_hours", "--batch-size": "micro_batch_size",
    "--grad-accum": "grad_accum_steps", "--lr": "learning_rate", "--seq-len": "seq_len",
    "--eval-every": "eval_every", "--eval-batches": "eval_batches", "--save-every": "save_every", "--keep-last": "keep_last",
    "--patience": "patience", "--dataset-percent": "dataset_percent", "--mixed-precision": "mixed_precision",
    "--compile": "compile", "--seed": "seed", "--log-every": "log_every", "--warmup-steps": "warmup_steps",
}


def overrides_from_args(args) -> dict[str, str]:
    out = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq:
            raise PiconeoxError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. train.max_steps=100")
        out[key.strip()] = value
    for key in SHORTCUTS.values():
        if getattr(args, key) is not None and not (key == "micro_batch_size" and args.micro_batch_size == "auto"):
            out[f"train.{key}"] = getattr(args, key)
    if args.data is not None:
        out["train.data"] = args.data
    return out


@dataclass
class TrainerState:
    """The loop's own progress; saved in every checkpoint as trainer.json."""

    step: int = 0
    tokens_seen: int = 0
    best_val_loss: float = math.inf
    evals_without_improvement: int = 0
    train_seconds: float = 0.0

    def state_dict(self) -> dict:
        d = asdict(self)
        d["best_val_loss"] = None if math.isinf(self.best_val_loss) else self.best_val_loss
        return d

    def load_state_dict(self, d: dict) -> None:
        for k, v in d.items():
            setattr(self, k, math.inf if (k == "best_val_loss" and v is None) else v)


GC_EVERY = 50  # steps between the training loop's garbage collections (automatic gc is off while it runs)
DATA_CACHE = Path("data") / "gcs-cache"  # gs:// datasets land in DATA_CACHE/<host>/<bucket>/<prefix>


def check_data_arg(train_cfg) -> Path | None:
    """Validate --data without reading it: the local dataset directory, or None for `demo` and gs://."""
    from utils.storage import parse_gs_url

    data = train_cfg.data
    if not data:
        raise PiconeoxError("no dataset: this preset needs --data DIR (prepare one with prepare_data.py) or --data gs://...")
    if data == "demo":
        return None
    if data.startswith("gs://"):
        parse_gs_url(data)  # a bad bucket name or prefix is one line before the launch
        return None
    out = Path(data.removeprefix("file://"))
    if out.is_file():  # a text file: it needs preparing first
        raise PiconeoxError(f"--data {data} is a file; prepare it first with `python prepare_data.py {data} --name {out.stem} "
                            f"--tokenizer {train_cfg.tokenizer}`, then pass --data data/{out.stem}")
    if not out.is_dir():
        raise PiconeoxError(f"--data {data}: no such directory; prepare it with `python prepare_data.py TEXT_FILES "
                            f"--out-dir {out.parent} --name {out.name} --tokenizer {train_cfg.tokenizer}`, or use --data demo")
    if train_cfg.dataset_percent != 100:
        raise PiconeoxError(f"--dataset-percent {train_cfg.dataset_percent:g} applies when the trainer prepares `demo`; "
                            f"for {data} run prepare_data.py --dataset-percent instead")
    return out


def data_name(train_cfg) -> str:
    """The dataset's folder name, known before it is prepared or synced: demo-<tokenizer>..., else the last path part."""
    if train_cfg.data == "demo":
        vocab = f"{train_cfg.tokenizer_vocab}" if train_cfg.tokenizer_vocab else ""
        pct = "" if train_cfg.dataset_percent == 100 else f"-p{train_cfg.dataset_percent:g}"
        return f"demo-{train_cfg.tokenizer}{vocab}{pct}"
    if train_cfg.data.startswith("gs://"):
        return train_cfg.data.rstrip("/").rsplit("/", 1)[-1]
    return Path(train_cfg.data.removeprefix("file://")).resolve().name


def run_dirs(args, cfg) -> tuple[str, Path, Path]:
    """(run name, checkpoints/<run>, logs/<run>); refuses a run name that is not a plain folder name."""
    run = args.run_name or f"{cfg.preset}-{data_name(cfg.train)}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", run):
        raise PiconeoxError(f"--run-name {run!r} is not allowed: use letters, digits, '.', '_' and '-'")
    return run, Path(args.output_dir) / run, Path(args.log_dir) / run


def prepare_data_dir(train_cfg, accelerator, credentials: str | None) -> Path:
    """The local dataset directory: `demo` is prepared on first use (one process per machine first); gs:// is
    synced here only by a single process: with more, start_training.sh syncs it before the launch."""
    from utils.shards import verify_dataset

    local = check_data_arg(train_cfg)
    if local is not None:
        with accelerator.local_main_process_first():  # on first use the shards' crc32c are hashed once per machine
            verify_dataset(local)
        return local
    if train_cfg.data == "demo":
        out = Path("data") / data_name(train_cfg)
        with accelerator.local_main_process_first():  # one process per machine prepares, the others reuse it
            if not (out / "manifest.json").exists():
                from prepare_data import prepare

                prepare(["demo"], name=out.name, out_dir=out.parent, tokenizer=train_cfg.tokenizer,
                        vocab_size=train_cfg.tokenizer_vocab, dataset_percent=train_cfg.dataset_percent)
        return out
    if accelerator.num_processes > 1:  # a download inside the process group would hold every other rank
        raise PiconeoxError(f"--data {train_cfg.data}: {accelerator.num_processes} processes cannot sync it; launch with "
                            "./start_training.sh (it syncs once per machine first) or download it with "
                            "download_training_data.py and pass the folder")
    from utils.sync import ensure_local

    return ensure_local(train_cfg.data, DATA_CACHE, credentials)


def with_init_from(args, cfg):
    """(cfg, checked --init-from checkpoint or None): the checkpoint's model shape replaces the preset's."""
    if not args.init_from:
        return cfg, None
    from configs.presets import RunConfig
    from utils.pretrained import open_pretrained

    pretrained = open_pretrained(args.init_from)
    return RunConfig(cfg.preset, pretrained.model, cfg.train).validate(), pretrained


def build_initial_model(cfg, resume_from: Path | None, pretrained, shapes_only: bool = False):
    """--init-from's weights, else a random init (a resume loads its weights after prepare(), each rank its shard).

    shapes_only: this rank's weights come from rank 0 in prepare() (see weights_come_from_rank0)."""
    from configs.model import build_model

    if pretrained and not resume_from and not shapes_only:
        model = pretrained.load_model()
    else:
        model = build_model(cfg.model, shapes_only=shapes_only)
    model.set_attn_implementation(cfg.train.attention)
    return model


def check_gcs_settings(args, cfg) -> None:
    """Every gs:// setting (--data, --checkpoint-bucket, --resume): the URL's shape, and credentials that
    load (--credentials, GOOGLE_APPLICATION_CREDENTIALS or application-default ones). No bucket is read."""
    from utils.storage import parse_gs_url, resolve_credentials

    urls = [url for url in (cfg.train.data, args.checkpoint_bucket, args.resume) if url and url.startswith("gs://")]
    for url in urls:
        parse_gs_url(url)
    if urls or args.credentials:
        resolve_credentials(args.credentials)


def preflight(args, cfg, pretrained) -> Path | None:
    """What runs before the launch: check the settings, output folders, --data (verified), --init-from, --resume
    and gs:// settings (no GPU), then sync a gs:// --data into this machine's cache and return that folder."""
    from utils import checkpoint as ckpt
    from utils.distributed import check_timeout
    from utils.preemption import StopRequest
    from utils.shards import verify_dataset
    from utils.sync import ensure_local
    from utils.trackers import check_wandb_login, parse_report_to
    from utils.uploader import CheckpointUploader

    if (local := check_data_arg(cfg.train)) is not None:
        dataset = verify_dataset(local)  # hashes the shards on first use; the launched run then finds them cached
        if pretrained:
            pretrained.check_dataset(local, dataset.tokenizer_sha256)
    check_timeout(args.collective_timeout_minutes)
    check_timeout(args.step_timeout_minutes, "--step-timeout-minutes", 10)
    if args.processes is not None and args.processes < 1:
        raise PiconeoxError(f"--processes {args.processes}: must be at least 1")
    if args.processes and not args.resume and args.micro_batch_size != "auto":  # a resume keeps its checkpoint's batch
        cfg.train.for_world(args.processes)
    check_new_run(args.resume, *run_dirs(args, cfg)[1:])
    StopRequest(args.grace_seconds)  # validates the grace period
    CheckpointUploader.check_settings(bool(args.checkpoint_bucket), cfg.train.keep_last, args.max_upload_failures)
    check_gcs_settings(args, cfg)
    if "wandb" in parse_report_to(args.report_to):
        check_wandb_login()  # caught here, not after the model is built
    if args.resume and args.resume != "auto" and not args.resume.startswith("gs://"):
        ckpt.resolve_resume(Path(args.resume), warn=lambda _: None)
    if cfg.train.data.startswith("gs://"):
        return ensure_local(cfg.train.data, DATA_CACHE, args.credentials)
    return None


def weights_come_from_rank0(accelerator) -> bool:
    """FSDP2 with cpu_ram_efficient_loading: prepare() shards rank 0's weights to every rank, so the others
    build shapes only (the host holds one fp32 model, not one per rank)."""
    plugin = accelerator.state.fsdp_plugin if accelerator.is_fsdp2 else None
    return bool(plugin and plugin.cpu_ram_efficient_loading and not accelerator.is_main_process)


def publish_final(last: Path, final: Path, consolidate: bool, log) -> None:
    """final/: the last step (hard links) plus its weights consolidated for from_pretrained; a stop on a signal
    skips the consolidation (no time for it) and says how to do it later."""
    from utils import checkpoint as ckpt
    from utils.consolidate import consolidate_into

    reason = ckpt.check_complete(last)
    if reason:  # the save failed, or several machines hold the shards (the bucket has them all)
        log.warning(f"final/ not written: {reason}")
        return
    if not consolidate:
        ckpt.link_copy(last, final)
        log.info(f"{final}: resumable; for from_pretrained weights run python -m utils.consolidate {last} --out DIR")
        return
    with consolidate_into(last) as weights:
        ckpt.link_copy(last, final, extra=weights)


def use_activation_checkpointing(cfg, accelerator, cuda: bool) -> bool:
    """on/off as set; auto: on with CUDA when the plan's memory estimate does not fit the GPU."""
    mode = cfg.train.activation_checkpointing
    if mode != "auto" or not cuda:
        return mode == "on"
    import torch
    from accelerate.utils import DistributedType

    from utils.plan import needs_activation_checkpointing, plan

    device_bytes = torch.cuda.get_device_properties(accelerator.device).total_memory
    sharded = accelerator.distributed_type == DistributedType.FSDP
    return needs_activation_checkpointing(plan(cfg, gpus=accelerator.num_processes), sharded, device_bytes)


def check_resumable(resumed: dict | None, resume_from, cfg, data_dir: Path) -> str:
    """Refuse a checkpoint of another model shape or tokenizer; return the dataset's tokenizer sha256."""
    from utils.shards import verify_dataset

    expected_tokenizer = None
    if resumed:
        saved, now = resumed["run_config"]["model"], cfg.model.to_dict()
        diff = next((k for k in saved if saved[k] != now.get(k)), None)
        if diff:
            raise PiconeoxError(f"--resume {resume_from}: checkpoint has model.{diff}={saved[diff]!r}, this run has {now[diff]!r}")
        expected_tokenizer = resumed["run_config"].get("data_tokenizer_sha256")
    return verify_dataset(data_dir, expected_tokenizer_sha256=expected_tokenizer).tokenizer_sha256


def batch_for_world(tc, world: int, resumed: dict | None):
    """The recipe's batch on `world` processes; a resume keeps the checkpoint's tokens per step (older
    checkpoints without train.global_batch_tokens tell it by tokens seen per step)."""
    fixed = None
    if resumed:
        trainer = resumed["trainer"]
        fixed = resumed["run_config"]["train"].get("global_batch_tokens") or (
            trainer["tokens_seen"] // trainer["step"] if trainer["step"] else None)
    return tc.for_world(world, fixed_global_batch=fixed)


def evaluate(model, val_loader, num_batches: int, accelerator, vote=None) -> float | None:
    """Mean cross-entropy over the first `num_batches` validation batches, averaged over ranks.

    `vote` (a StopVote) is asked before every batch; None is returned when the ranks agreed to stop.
    """
    import torch

    model.eval()
    total = torch.zeros((), device=accelerator.device)
    count = 0
    with torch.no_grad():
        for batch in val_loader.eval_batches(num_batches):
            if vote is not None and vote():
                break
            with accelerator.autocast():
                total += lm_loss(model, *to_device(batch, accelerator.device))
            count += 1
    model.train()
    if vote is not None and vote.stopping:
        return None
    return accelerator.reduce(total / max(count, 1), "mean").item()


def to_device(batch, device):
    """A loader batch on `device`: on CUDA through pinned memory, asynchronously (no wait for the copy)."""
    if device.type != "cuda":
        return batch
    return tuple(t.pin_memory().to(device, non_blocking=True) for t in batch)


def lm_loss(model, x, y):
    """Next-token cross-entropy; the loader already shifted the labels, so the model gets no `labels`."""
    import torch.nn.functional as F

    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))


def find_micro_batch(model, seq_len: int, accelerator, start: int = 256) -> int:
    """The largest micro batch (halving from `start` on out-of-memory) whose forward/backward fits.

    The probe runs before the optimizer allocates its AdamW states, so leave headroom on tight GPUs.
    """
    import torch
    from accelerate.utils import find_executable_batch_size

    @find_executable_batch_size(starting_batch_size=start)
    def probe(batch_size: int) -> int:
        x = torch.zeros(batch_size, seq_len, dtype=torch.long, device=accelerator.device)
        with accelerator.autocast():
            lm_loss(model, x, x).backward()
        model.zero_grad(set_to_none=True)
        return batch_size

    return probe()


def train(args, cleanup: contextlib.ExitStack) -> int:
    """The run; `cleanup` closes the checkpoint uploader (a flush) and the signal handlers on every exit path."""
    from configs.presets import resolve_config
    from utils.trackers import parse_report_to

    cfg, pretrained = with_init_from(args, resolve_config(args.config, args.config_file, overrides_from_args(args)))
    report_to = parse_report_to(args.report_to)
    if args.preflight:
        synced = preflight(args, cfg, pretrained)
        if synced is not None:
            print(synced)  # start_training.sh passes this folder as the run's --data
        return 0
    if args.print_plan:
        from utils.plan import format_plan, plan

        print(format_plan(plan(cfg, gpus=args.gpus)))
        return 0

    import torch
    import transformers
    from accelerate.utils import set_seed

    from configs.model import count_parameters
    from configs.presets import RunConfig
    from utils import checkpoint as ckpt
    from utils.distributed import describe, group_timeout, main_decides, make_accelerator, shorten_timeout
    from utils.loader import BlockLoader
    from utils.metrics import MetricsWriter, ProgressBar, gpu_stats, mfu, model_flops_per_token, peak_flops, setup_logging
    from utils.optim import build_optimizer, build_scheduler
    from utils import resume
    from utils.preemption import StopRequest, StopVote
    from utils.storage import open_storage
    from utils.sync import host_dir
    from utils.tokenizers import load_tokenizer
    from utils.upload_report import closing_word
    from utils.uploader import CheckpointUploader, SaveRequest, UploadFailed

    tc = cfg.train
    transformers.utils.logging.disable_progress_bar()  # save_pretrained's shard bar would break our own bar
    accelerator = make_accelerator(tc.mixed_precision, torch.cuda.is_available(), args.collective_timeout_minutes)
    cuda = accelerator.device.type == "cuda"  # False with --gpus 0 even where a GPU exists
    is_main = accelerator.is_main_process
    set_seed(tc.seed)
    cleanup.callback(torch.set_float32_matmul_precision, torch.get_float32_matmul_precision())  # process-wide
    torch.set_float32_matmul_precision(tc.matmul_precision)

    # Data first: it decides the vocabulary.
    data_dir = prepare_data_dir(tc, accelerator, args.credentials)
    tokenizer = pretrained.load_tokenizer() if pretrained else load_tokenizer(data_dir)
    rank, world = accelerator.process_index, accelerator.num_processes

    def make_loaders(micro_batch: int):
        return (BlockLoader(data_dir, "train", tc.seq_len, micro_batch, seed=tc.seed, rank=rank, world_size=world),
                BlockLoader(data_dir, "val", tc.seq_len, micro_batch, seed=tc.seed, rank=rank, world_size=world, shuffle=False))

    train_loader, val_loader = make_loaders(tc.micro_batch_size)
    cfg = RunConfig(cfg.preset, cfg.model.with_vocab(train_loader.vocab_size), tc).validate()

    run, run_dir, log_dir = run_dirs(args, cfg)
    main_decides(accelerator, lambda: check_new_run(args.resume, run_dir, log_dir))
    claim = RunClaim(run_dir, log_dir)  # refused before the first step: what this attempt added goes again
    if is_main:
        claim.make()
        cleanup.push(lambda exc_type, *_: claim.release() if exc_type else None)  # after the writers below close
    log = setup_logging(log_dir / "training.log", is_main)
    metrics = MetricsWriter(log_dir, is_main, report_to)
    cleanup.callback(metrics.close)  # on every exit path: flush TensorBoard, finish the W&B run

    # Each storage call gives up within one grace period, so a dead bucket cannot hold a clean stop for long.
    stop = StopRequest(args.grace_seconds)
    bucket = None
    if args.checkpoint_bucket:
        bucket = open_storage(args.checkpoint_bucket, args.credentials, timeout_s=args.grace_seconds).child(run)
    remote_cache = host_dir(Path(args.output_dir) / ".remote-cache")  # machines may share output_dir
    # Every rank writes and uploads its own shard on its own thread; rank 0 completes each checkpoint.
    uploader = cleanup.enter_context(CheckpointUploader(
        bucket, keep_remote=tc.keep_last, keep_local=tc.keep_last, max_failures=args.max_upload_failures,
        background=not args.no_background_upload, progress=is_main, rank=rank,
        group=ckpt.checkpoint_group(timedelta(minutes=args.collective_timeout_minutes)),
        rotate_local=accelerator.is_local_main_process))

    # Resume target (decided before building anything heavy, so a bad path fails fast): rank 0 decides.
    resume_from = resume.agree(accelerator, args.resume, run_dir, bucket, remote_cache, args.credentials,
                              args.grace_seconds, log)
    resumed = ckpt.load_common(resume_from, rank) if resume_from else None
    tokenizer_sha256 = check_resumable(resumed, resume_from, cfg, data_dir)
    if pretrained:
        pretrained.check_dataset(data_dir, tokenizer_sha256)
        log.info(f"--init-from {pretrained.path}: model shape from its config.json ({pretrained.describe()}), not the "
                 f"preset's model section" + ("" if resume_from else "; its weights and tokenizer, a fresh optimizer"))
    tc = batch_for_world(tc, world, resumed)
    cfg = replace(cfg, train=tc)

    # A resume loads its weights after prepare(), each rank only its shard.
    shapes_only = weights_come_from_rank0(accelerator)
    model = build_initial_model(cfg, resume_from, pretrained, shapes_only=shapes_only)
    if use_activation_checkpointing(cfg, accelerator, cuda):
        model.activation_checkpointing_enable()
        log.info("activation checkpointing on: each layer's activations are recomputed in the backward pass")
    n_params = count_parameters(model)
    log.info(f"run {run}: preset {cfg.preset}, {n_params:,} parameters, data {data_dir} "
             f"(vocab {train_loader.vocab_size}, {train_loader.tokens_per_epoch:,} train tokens), "
             f"{world} process(es) on {accelerator.device} ({describe(accelerator)}), mixed precision {tc.mixed_precision}"
             + (f", collective timeout {timeout.total_seconds() / 60:g} min" if (timeout := group_timeout(accelerator)) else ""))
    if is_main and (note := ckpt.grace_warning(n_params, world, args.grace_seconds, bucket is not None)):
        log.warning(note)
    # FSDP2: prepare() shards and places the weights; moving rank 0's full fp32 model onto its GPU first would
    # cost 5.7 GB there at 1.2B, and a batch probe of that unsharded model measures the wrong memory.
    sharded = accelerator.is_fsdp2
    if not shapes_only and not sharded:
        model.to(accelerator.device)
    if args.micro_batch_size == "auto":
        if cuda and sharded:
            log.warning("--batch-size auto: FSDP2 cannot probe before sharding; using the preset's micro batch")
        elif cuda:  # ranks holding shapes only cannot probe: they leave the choice to the others
            probed = 1 << 30 if shapes_only else find_micro_batch(model, tc.seq_len, accelerator)
            found = torch.tensor(-probed, device=accelerator.device)
            # the smallest over ranks (the loader's rank split needs one batch size everywhere) that divides the global batch
            fits = tc.largest_micro_batch(world, limit=-int(accelerator.reduce(found, "max").item()))
            tc = replace(tc, micro_batch_size=fits).for_world(world, fixed_global_batch=tc.global_batch_tokens)
            train_loader, val_loader = make_loaders(tc.micro_batch_size)
            cfg = replace(cfg, train=tc)
        log.info(f"--batch-size auto: micro batch {tc.micro_batch_size}"
                 + ("" if cuda else " (no CUDA: the preset's size; auto needs a GPU to measure)"))
    log.info(f"global batch {tc.global_batch_tokens:,} tokens per step = micro batch {tc.micro_batch_size} x "
             f"{tc.grad_accum_steps} accumulation x {world} process(es) x {tc.seq_len} tokens")
    log.info(f"math: {tc.attention} attention, float32 matmul precision {tc.matmul_precision}, "
             f"mixed precision {tc.mixed_precision}")
    optimizer = build_optimizer(model, tc.learning_rate, tc.weight_decay, (tc.beta1, tc.beta2))
    scheduler = build_scheduler(optimizer, tc.warmup_steps, tc.max_steps, tc.min_lr_ratio)
    model, optimizer = accelerator.prepare(model, optimizer)  # the scheduler stays ours: one step per optimizer step
    if tc.compile == "on" or (tc.compile == "auto" and cuda):
        model = torch.compile(model)  # after prepare(): saved keys never carry `_orig_mod.`

    state = TrainerState()
    if resumed:
        ckpt.load_sharded(resume_from, accelerator.unwrap_model(model, keep_torch_compile=False), optimizer.optimizer)
        scheduler.load_state_dict(resumed["scheduler"])
        if resumed["scaler"] is not None and accelerator.scaler is not None:
            accelerator.scaler.load_state_dict(resumed["scaler"])
        ckpt.set_rng_state(resumed["rng"])
        train_loader.load_state_dict(resumed["loader"])
        state.load_state_dict(resumed["trainer"])
        metrics.load_state_dict(resumed["metrics"])
        log.info(f"resumed from {resume_from} at step {state.step} ({state.tokens_seen:,} tokens seen)")
    if state.step >= tc.max_steps:
        raise PiconeoxError(f"--max-steps {tc.max_steps}: the resumed run is already at step {state.step}; raise --max-steps")

    saved_step = state.step  # the step of the newest full checkpoint handed to the uploader
    run_config = {**cfg.to_dict(), "data_tokenizer_sha256": tokenizer_sha256, "init_from": args.init_from}
    main_decides(accelerator, lambda: metrics.start(state.step, {**run_config, "run": {
        "name": run, "data_dir": str(data_dir), "parameters": n_params, "world_size": world, "device": accelerator.device.type}}))
    claim.accept()  # every check passed: from here on the run's files stay
    if is_main and args.resume == "auto" and not resume_from:
        keep_earlier_best(run_dir, log)

    def save(folder: Path, weights_only: bool = False) -> None:
        """Only the copy of this rank's shard off the device blocks; the uploader threads write, upload, rotate."""
        nonlocal saved_step
        if not weights_only:
            saved_step = state.step
            if accelerator.is_local_main_process:
                ckpt.prepare_step_folder(folder)  # an interrupted earlier save of this step; before any rank writes
        start = time.monotonic()
        snap = ckpt.capture(state.step, accelerator.unwrap_model(model, keep_torch_compile=False), optimizer.optimizer,
                            scheduler, accelerator.scaler, train_loader, state, metrics,
                            run_config, tokenizer,
                            rank=rank, world_size=world, weights_only=weights_only)
        (log.info if is_main else log.debug)(
            f"checkpoint {folder.name}: training blocked {time.monotonic() - start:.3f} s copying its state")
        if is_main or not weights_only:  # best/: the weights were gathered onto rank 0 only
            uploader.submit(SaveRequest(snap, folder, weights_only))

    def check_uploads() -> None:
        """Log and count finished saves; too many failures in a row stop the run cleanly (it then exits 2)."""
        for result in uploader.poll():
            if not result.ok:
                metrics.scalars(state.step, {"upload/failures": uploader.failures})
        if uploader.fatal:
            stop.request(uploader.fatal)

    flops_per_token = model_flops_per_token(cfg.model, tc.seq_len)
    peak = peak_flops(torch.cuda.get_device_name() if cuda else None, tc.mixed_precision)
    deadline = time.time() + tc.max_training_hours * 3600 - state.train_seconds if tc.max_training_hours else math.inf
    # Signals on any rank, the time limit on rank 0's clock.
    vote = StopVote(stop, accelerator, deadline, timedelta(minutes=args.step_timeout_minutes))
    first_step = state.step + 1  # compiled and warmed up after this one: collectives get the short timeout
    batches = iter(train_loader)
    bar = ProgressBar(tc.max_steps, state.step, is_main)
    recent_losses: collections.deque[float] = collections.deque(maxlen=100)  # for the bar's running average
    window = (time.time(), state.step)  # steps since the last loss read, for tokens/s
    interval_tokens, interval_seconds = 0, 0.0  # for the eval line's throughput
    stop_reason = "max steps reached"
    cleanup.enter_context(stop)  # SIGTERM/SIGINT now only ask for a clean stop
    # Automatic gc runs whenever allocations pile up, at a different moment on every rank: the others then wait
    # for it in the next collective. Collect at the same steps everywhere instead (torchtitan does the same).
    gc.disable()
    cleanup.callback(gc.enable)
    model.train()
    while state.step < tc.max_steps:
        t0 = time.time()
        check_uploads()  # finished saves; too many failures become a stop request that the vote spreads to all ranks
        # Only a stop between micro-steps leaves a half-done step to rewind; with one micro-step there is none.
        step_start = (train_loader.state_dict(), ckpt.rng_state()) if tc.grad_accum_steps > 1 else None
        loss_sum = torch.zeros((), device=accelerator.device)
        for micro in range(tc.grad_accum_steps):
            if vote():
                break
            x, y = to_device(next(batches), accelerator.device)
            sync_ctx = accelerator.no_sync(model) if micro < tc.grad_accum_steps - 1 else contextlib.nullcontext()
            with sync_ctx:
                with accelerator.autocast():
                    loss = lm_loss(model, x, y)
                accelerator.backward(loss / tc.grad_accum_steps)
            loss_sum += loss.detach()
        if vote.stopping:  # drop the unfinished step: a resume reads its batches again
            if step_start is not None:
                train_loader.load_state_dict(step_start[0])
                ckpt.set_rng_state(step_start[1])
            optimizer.zero_grad(set_to_none=True)
            break
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.tokens_seen += tc.global_batch_tokens
        state.train_seconds += time.time() - t0
        bar.update(1)
        if state.step % GC_EVERY == 0:
            gc.collect(1)
        if state.step == first_step and world > 1:
            shorten_timeout(args.step_timeout_minutes)
            log.info(f"collective timeout {group_timeout(accelerator).total_seconds() / 60:g} min from step "
                     f"{first_step + 1} on (stop vote {group_timeout(accelerator, vote.group).total_seconds() / 60:g} "
                     f"min, checkpoint savers {group_timeout(accelerator, uploader.group).total_seconds() / 60:g} min)")
        logging_due = state.step % tc.log_every == 0 or state.step == tc.max_steps
        eval_due = state.step % tc.eval_every == 0 or state.step == tc.max_steps
        save_due = state.step % tc.save_every == 0
        if not (logging_due or eval_due or save_due):
            continue  # no host sync on other steps: the GPU keeps its queue of work
        loss = accelerator.reduce(loss_sum / tc.grad_accum_steps, "mean").item()
        if not math.isfinite(loss):
            raise TrainingDiverged(f"loss is {loss} at step {state.step}; stopped without saving "
                                   f"(the last good checkpoint is {ckpt.latest_complete(run_dir) or 'none'})")
        steps = state.step - window[1]
        dt = (time.time() - window[0]) / steps  # per step, GPU work included since .item() waited
        window = (time.time(), state.step)
        interval_tokens, interval_seconds = interval_tokens + steps * tc.global_batch_tokens, interval_seconds + steps * dt
        recent_losses.append(loss)
        lr = scheduler.get_last_lr()[0]
        tok_s = tc.global_batch_tokens / dt
        bar.update(0, loss=loss, avg_loss=sum(recent_losses) / len(recent_losses), lr=lr, tok_s=tok_s)
        if logging_due:
            metrics.scalars(state.step, {
                "train/loss": loss, "train/lr": lr, "train/grad_norm": float(grad_norm), "train/step_time_s": dt,
                "train/tokens_per_s": tok_s, "train/tokens_per_s_per_device": tok_s / world if world > 1 else None,
                "train/mfu": mfu(tok_s / world, flops_per_token, peak), **gpu_stats()})
            log.debug(f"step {state.step} loss {loss:.6f} lr {lr:.3e}")

        if eval_due:
            val = evaluate(model, val_loader, tc.eval_batches, accelerator, vote)
            if val is None:  # stopped inside the evaluation
                break
            improved = val < state.best_val_loss
            state.best_val_loss = min(val, state.best_val_loss)
            metrics.scalars(state.step, {"val/loss": val, "val/perplexity": math.exp(min(val, 50)),
                                         "val/best_loss": state.best_val_loss})
            state.evals_without_improvement = 0 if improved else state.evals_without_improvement + 1
            avg_tok_s = interval_tokens / interval_seconds  # since the last eval line, not just this step
            interval_tokens, interval_seconds = 0, 0.0
            util, gpu = mfu(avg_tok_s / world, flops_per_token, peak), gpu_stats()
            gpu_text = "n/a" if gpu["gpu/util_pct"] is None else f"{gpu['gpu/util_pct']:.0f}% busy, {gpu['gpu/mem_gb']:.1f} GB"
            log.info(f"step {state.step}: train loss {loss:.4f}, val loss {val:.4f}, perplexity {math.exp(min(val, 50)):.2f}, "
                     f"{avg_tok_s:,.0f} tok/s{f' ({avg_tok_s / world:,.0f} per device)' if world > 1 else ''}, MFU {f'{util:.1%}' if util else 'n/a'}, GPU {gpu_text}"
                     + (" (best)" if improved else f" ({state.evals_without_improvement} eval(s) without improvement)"))
            if improved:
                save(run_dir / "best", weights_only=True)
            if tc.patience and state.evals_without_improvement >= tc.patience:
                stop_reason = f"early stopping: no val improvement in {tc.patience} evaluations"
                break
        if save_due:
            save(run_dir / ckpt.step_dir_name(state.step))
        if eval_due or save_due:  # tokens/s and MFU count training steps, not the evaluation and save just done
            window = (time.time(), state.step)
    bar.close()
    vote.close()
    preempted = vote.stopping and not vote.time_up  # a signal or upload failures: the grace budget applies
    if vote.time_up:
        stop_reason = f"time limit of {tc.max_training_hours:g} h reached"
    elif preempted:
        stop_reason = f"{stop.reason}; stopped cleanly"
        log.info(f"{stop.reason}: saving step {state.step} and flushing uploads (grace {stop.grace_seconds:g} s)")

    last = run_dir / ckpt.step_dir_name(state.step)
    if saved_step != state.step:  # breaks (early stop, signal) can come before a due save
        save(last)
    sample = None
    if not preempted:  # a preempted run has no time for a sample; otherwise it overlaps the upload flush
        sample = log_sample(accelerator.unwrap_model(model, keep_torch_compile=False), tokenizer, args.sample_prompt, tc.seed, log)
    uploader.close(timeout=stop.remaining())  # every rank's saver; no limit unless stopping on a signal
    check_uploads()
    not_uploaded = None  # the exit-3 line when the run's newest checkpoint is not in the bucket
    if is_main:
        publish_final(last, run_dir / "final", consolidate=not preempted, log=log)
        metrics.save_history(log_dir / "history.json")
        metrics.plot(log_dir / "loss.png")
        log.info(f"stopped at step {state.step}: {stop_reason}; best val loss {state.best_val_loss:.4f}"
                 + (f"; peak GPU memory {torch.cuda.max_memory_allocated() / 1e9:.1f} GB" if cuda else ""))
        if bucket is not None:
            not_uploaded = closing_word(bucket, run_dir, args.checkpoint_bucket, args.credentials, log)
        log.info(f"checkpoints in {run_dir}, logs in {log_dir} ({shown_path(Path(sys.executable).parent / 'tensorboard')} "
                 f"--logdir {args.log_dir})")
        log.info(next_commands(cfg.preset, run_dir, stopped=stop.stopping))
        if sample is not None:
            metrics.text(state.step, "sample", sample)
        metrics.close()
    accelerator.wait_for_everyone()  # tear the process group down together: a rank leaving alone can abort
    accelerator.end_training()
    if not_uploaded:
        return exit_status.finish(exit_status.NOT_UPLOADED, not_uploaded)
    if uploader.fatal:
        raise UploadFailed(uploader.fatal)
    return 0


def log_sample(model, tokenizer, prompt: str, seed: int, log) -> str:
    """Every rank samples: under FSDP each forward all-gathers the shards, so rank 0 alone would hang.

    The same seed and the same gathered weights give every rank the same 200 forwards; rank 0 logs.
    """
    from utils.generate import readable_sample, sample_text

    text = readable_sample(sample_text(model, tokenizer, prompt, max_new_tokens=200, temperature=0.8, top_k=40, seed=seed),
                    tokenizer.eos_token)
    log.info("sample:\n" + text)
    return text


def shown_path(path: Path) -> str:
    """`path` relative to the current directory when it lies below it (shorter to copy), else absolute."""
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else str(path)


def next_commands(preset: str, run_dir: Path, stopped: bool) -> str:
    """What a newcomer runs after training: continue, sample, evaluate, and for Pico presets export."""
    py = shown_path(Path(sys.executable))
    lines = ["next:"]
    if stopped:
        lines.append("  continue this run: the same command plus --resume auto")
    sampled = next((run_dir / name for name in ("best", "final") if (run_dir / name).is_dir()), None)
    if sampled is not None:  # a stop before the first evaluation has no best/ (nor final/ when its save failed)
        lines.append(f"  {py} -m utils.generate {sampled} --prompt \"Once upon a time\" --max-new-tokens 200")
    if preset.startswith(("rp2040", "pico")):
        lines.append(f"  {py} -m rp2040.export {run_dir} --out models/{run_dir.name} --dtype int8   # then rp2040.run / rp2040.flash")
    return "\n".join(lines)


class TrainingDiverged(PiconeoxError):
    """A NaN or inf loss: the run stops and names the step."""


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        with contextlib.ExitStack() as cleanup:
            return train(args, cleanup)
    except PiconeoxError as e:
        return exit_status.finish(exit_status.REFUSED, f"error: {e}")
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
