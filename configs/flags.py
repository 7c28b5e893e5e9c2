"""The trainer's command line: every flag, and the flags as `section.key` overrides for
configs.presets.resolve_config (the same words as `--set section.key=VALUE` and a --config-file's sections)."""
from __future__ import annotations

import argparse
from dataclasses import fields

from configs.presets import PRESET_NAMES
from configs.run import RunSettings
from utils.errors import CliParser, PiconeoxError, at_least
from utils.run.budget import parse_duration

# Shortcuts for the most used train.* settings (same as --set train.KEY=VALUE).
SHORTCUTS = {
    "--max-steps": "max_steps", "--max-training-hours": "max_training_hours", "--batch-size": "micro_batch_size",
    "--grad-accum": "grad_accum_steps", "--lr": "learning_rate", "--seq-len": "seq_len",
    "--eval-every": "eval_every", "--eval-batches": "eval_batches", "--save-every": "save_every",
    "--keep-last": "keep_last", "--patience": "patience", "--dataset-percent": "dataset_percent",
    "--mixed-precision": "mixed_precision", "--compile": "compile", "--seed": "seed", "--log-every": "log_every",
    "--warmup-steps": "warmup_steps", "--time-budget": "time_budget_s",
}
HELP = {"--time-budget": "wall-clock budget for the whole run, start-up to final save: seconds, or 90m, 1h30m; the "
                         "schedule decays to end at it (= --set train.time_budget_s=VALUE)"}
# Every run.* setting as a flag, --run-name = --set run.run_name=VALUE (background_upload has --no-background-upload).
RUN_FLAGS = {"--" + f.name.replace("_", "-"): f.name for f in fields(RunSettings) if f.name != "background_upload"}


def parse_args(argv=None, description: str = "") -> argparse.Namespace:
    """Every flag of the trainer; settings travel on as `section.key` overrides (`overrides_from_args`)."""
    p = CliParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="test", help=f"preset name ({', '.join(PRESET_NAMES)})")
    p.add_argument("--config-file",
                   help="YAML file with `model:`, `train:` and/or `run:` sections overriding the preset")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any setting, e.g. --set model.num_layers=6 (repeatable)")
    p.add_argument("--data", help="prepared dataset dir, gs:// or s3://bucket/prefix of one, or `demo`")
    p.add_argument("--print-plan", action="store_true",
                   help="print parameters, batch, tokens and memory per GPU, then exit")
    p.add_argument("--preflight", action="store_true", help="check every setting, sync a bucket --data into "
                   "data/gcs-cache/<host>/, print that folder and exit (start_training.sh runs it once per machine)")
    p.add_argument("--print-sharding", action="store_true", help="print fsdp or ddp, what start_training.sh launches "
                   "on --gpus GPUs in all without --accelerate-config (from the model's size), then exit")
    p.add_argument("--gpus", type=at_least(0), default=1,
                   help="GPUs assumed by --print-plan and --print-sharding (default 1)")
    p.add_argument("--machines", type=at_least(1), default=1, help="machines the --gpus are spread over, for "
                   "--print-plan (default 1); on several, FSDP2 runs as HSDP and shards over one machine's GPUs")
    p.add_argument("--processes", type=int, metavar="N", help="with --preflight: the training processes the launch "
                   "starts (the global batch must divide over them; start_training.sh passes it)")
    p.add_argument("--no-background-upload", dest="background_upload", action="store_const", const="false",
                   help="= --set run.background_upload=false: write and upload checkpoints synchronously")
    for flag, key in RUN_FLAGS.items():
        p.add_argument(flag, dest=key, default=None, help=f"= --set run.{key}=VALUE (see configs/run.py)")
    for flag, key in SHORTCUTS.items():
        p.add_argument(flag, dest=key, default=None, help=HELP.get(flag, f"= --set train.{key}=VALUE"))
    p.epilog = "--batch-size auto: the largest micro batch whose forward/backward fits on the GPU (CUDA only)."
    return p.parse_args(argv)


def overrides_from_args(args) -> dict[str, str]:
    """The flags as `section.key` overrides for configs.presets.resolve_config (flags beat --config-file)."""
    out = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq:
            raise PiconeoxError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. train.max_steps=100")
        out[key.strip()] = value
    for key in SHORTCUTS.values():
        if getattr(args, key) is not None and not (key == "micro_batch_size" and args.micro_batch_size == "auto"):
            out[f"train.{key}"] = getattr(args, key)
    if args.time_budget_s is not None:  # the flag's own name in its error line
        out["train.time_budget_s"] = parse_duration(args.time_budget_s)
    for key in [*RUN_FLAGS.values(), "background_upload"]:
        if getattr(args, key) is not None:
            out[f"run.{key}"] = getattr(args, key)
    if args.data is not None:
        out["train.data"] = args.data
    return out
