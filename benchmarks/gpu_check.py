"""The stages of benchmarks/gpu_check.sh (its CLI): each prints one JSON line per measurement to OUT/results.jsonl
and a readable row to stdout. See docs/gpus.md, "Checking a GPU box".

    python benchmarks/gpu_check.py STAGE --out DIR [--cpu-smoke] [--steps N] [--limit-s S]
    STAGE: env, kernels, train, save, resume, fsdp, fsdp-resume (or all: every one in that order)

Each stage starts one training run at most, killed past --limit-s (an ok=false line); a run that failed or ran past
it makes the exit code 1. Without --cpu-smoke a machine whose torch sees no CUDA GPU is refused (exit 2). The save,
resume, fsdp and fsdp-resume stages need an even --steps of at least 2 (saves at the middle and the last step).
--cpu-smoke runs every stage on the CPU with the tiny `test` preset (what the test suite runs): same keys, CPU
values (None where a measurement needs CUDA), so the script cannot rot unnoticed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_kernels import stage_env, stage_kernels  # noqa: E402
from benchmarks.gpu_results import GB, record  # noqa: E402
from benchmarks.gpu_runs import (blocking, history, max_dloss, read, run_train, speed,  # noqa: E402
                                 steps_during_write)
from utils.atomic import check_writable_dir  # noqa: E402
from utils.errors import CliParser, PiconeoxError, at_least, cli, exit_process  # noqa: E402


@dataclass
class Check:
    out: Path
    cpu: bool
    steps: int
    limit_s: float  # per run
    variant: str = "base"


VARIANTS = {"base": [], "micro_x2": ["--batch-size", "8"], "compile_off": ["--compile", "off"]}


def stage_train(c: Check) -> bool:
    """Production on one GPU, one run: build/compile/first step, steady tok/s and MFU, memory, recompiles
    (`--variant micro_x2` or `compile_off` for a second command)."""
    name = "train-base" if c.variant == "base" else f"train-{c.variant}"
    run = run_train(c.out, name, c.cpu, c.limit_s, ["--max-steps", str(c.steps), "--save-every", str(10 * c.steps),
                                                    *([] if c.cpu else VARIANTS[c.variant])])
    record(c.out, "train", variant=c.variant, micro_batch=8 if c.variant == "micro_x2" else 4,
           compile=not c.cpu and c.variant != "compile_off", **speed(run))
    shutil.rmtree(c.out / "ckpt" / name, ignore_errors=True)  # disk: only the save stages keep a checkpoint
    return run.ok


def stage_save(c: Check) -> bool:
    """One run saving at the middle step and the last (keep_last 2: the resume stage starts from the first): the
    first and the later save's blocking seconds, write and crc32c GB/s, step time during the write against the other
    steps, staged GB; the run's losses against the train stage's base run (the noise floor, not zero: GPU kernels
    vary; None without a train stage of these --steps)."""
    from utils.ckpt.format import step_dir_name
    from utils.crc import crc32c_file

    every, out = c.steps // 2, c.out
    run = run_train(out, "save-a", c.cpu, c.limit_s, ["--max-steps", str(c.steps), "--save-every", str(every),
                                                      "--keep-last", "2"])
    straight = history(out / "logs" / "train-base")
    folder = out / "ckpt" / "save-a" / step_dir_name(every)
    rows, blocked = history(run.log_dir), blocking(run.log_dir)
    write = re.search(rf"saved checkpoint \S+{step_dir_name(every)} \(([\d.]+) s\)", read(run.log_dir / "training.log"))
    write_s = float(write.group(1)) if write else None
    shards = [p for p in folder.glob("*.distcp")] if folder.is_dir() else []
    size = sum(p.stat().st_size for p in folder.iterdir()) if folder.is_dir() else 0
    staged = sum(p.stat().st_size for p in shards)
    start = time.monotonic()
    for p in shards:
        crc32c_file(p)
    crc_s = time.monotonic() - start
    busy = steps_during_write(rows, every, blocked["blocking_first_s"] or 0.0, write_s or 0.0)
    quiet = [rows[s]["train/step_time_s"] for s in rows if s > 2 and s != every + 1 and s not in busy]
    ratio = statistics.median(rows[s]["train/step_time_s"] for s in busy) / statistics.median(quiet) \
        if busy and quiet else None
    record(out, "save", ok=run.ok, **blocked, write_s=write_s, write_gb_per_s=size / GB / write_s if write_s else None,
           crc32c_gb_per_s=staged / GB / crc_s if shards and crc_s > 0 else None,
           step_ratio_during_write=ratio, steps_during_write=len(busy), staged_gb=staged / GB, checkpoint_gb=size / GB,
           noise_floor_max_dloss=max_dloss(rows, straight, 0) if max(straight, default=0) == c.steps else None)
    shutil.rmtree(out / "ckpt" / "save-a" / step_dir_name(c.steps), ignore_errors=True)  # the resume needs `every`
    return run.ok


# FSDP2 as production runs it on 1 GPU (CPU mode: 1 process, a gloo group of one; 2 ranks are tests/ranks/
# test_fsdp.py's), with 2 micro-steps per step as production accumulates (the first without gradient sync,
# parameters kept gathered: utils/sharding.py)
FSDP_ARGS = ["--grad-accum", "2"]


def stage_fsdp(c: Check) -> bool:
    """FSDP2 with configs/accelerate/fsdp_production.yaml on 1 GPU, one run saving at the middle step and the last:
    what the train stage records, both saves' blocking seconds, the checkpoint's size (fsdp-resume starts from it)."""
    from utils.ckpt.format import step_dir_name

    every = c.steps // 2
    run = run_train(c.out, "fsdp", c.cpu, c.limit_s, ["--max-steps", str(c.steps), *FSDP_ARGS, "--save-every",
                                                      str(every), "--keep-last", "2"], fsdp=True)
    folder = c.out / "ckpt" / "fsdp" / step_dir_name(every)
    size = sum(p.stat().st_size for p in folder.iterdir()) / GB if folder.is_dir() else None
    record(c.out, "fsdp", **speed(run), **blocking(run.log_dir), checkpoint_gb=size)
    shutil.rmtree(c.out / "ckpt" / "fsdp" / step_dir_name(c.steps), ignore_errors=True)
    return run.ok


def resume(c: Check, kind: str, after: str, name: str) -> bool:
    """One run resumed from run `name`'s mid-run checkpoint (written by the stage `after`): its losses against the
    first run's own after that step."""
    from utils.ckpt.format import step_dir_name

    every = c.steps // 2
    folder = c.out / "ckpt" / name / step_dir_name(every)
    if not folder.is_dir():
        raise PiconeoxError(f"{folder} is missing: run the {after} stage (same --out and --steps) first")
    saved = history(c.out / "logs" / name)  # read before the resume appends to the same run's history
    fsdp = after == "fsdp"
    run = run_train(c.out, name, c.cpu, c.limit_s, ["--max-steps", str(c.steps), "--save-every", str(10 * c.steps),
                                                    *(FSDP_ARGS if fsdp else []), "--resume", str(folder)], fsdp=fsdp)
    # the history holds the first run's rows too: of a resume that failed, they would compare equal to themselves
    record(c.out, kind, ok=run.ok, resume_max_dloss=max_dloss(history(run.log_dir), saved, every) if run.ok else None)
    shutil.rmtree(c.out / "ckpt" / name, ignore_errors=True)  # the check leaves no checkpoint behind
    with contextlib.suppress(OSError):
        (c.out / "ckpt").rmdir()  # once no other stage's run keeps one there
    return run.ok


STAGES = {"env": lambda c: stage_env(c.out, c.cpu) or True, "kernels": lambda c: stage_kernels(c.out, c.cpu) or True,
          "train": stage_train, "save": stage_save, "resume": lambda c: resume(c, "resume", "save", "save-a"),
          "fsdp": stage_fsdp, "fsdp-resume": lambda c: resume(c, "fsdp-resume", "fsdp", "fsdp")}
SAVING = ("save", "resume", "fsdp", "fsdp-resume", "all")


def require_cuda() -> None:
    """The GPU mode's one requirement, said in one line naming what is missing."""
    import torch

    if torch.cuda.is_available():
        return
    why = (f"torch {torch.__version__} is a CPU-only build" if torch.version.cuda is None else
           f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but finds no GPU or driver "
           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    raise PiconeoxError(f"torch sees no CUDA GPU on this machine ({why}); run it on a GPU box, or add --cpu-smoke")


def parse(argv) -> argparse.Namespace:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=[*STAGES, "all"])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--cpu-smoke", action="store_true")
    p.add_argument("--steps", type=at_least(1), default=None,
                   help="training steps per run (default 20 on a GPU, 6 on CPU; even for the stages that save)")
    p.add_argument("--variant", choices=VARIANTS, default="base", help="the train stage's run (default base)")
    p.add_argument("--limit-s", type=float, default=480.0,
                   help="each run's limit in seconds (default 480: a lent box's command gets 600); past it the "
                        "run is killed and recorded as ok=false")
    args = p.parse_args(argv)
    if args.steps is not None and args.stage in SAVING and (args.steps < 2 or args.steps % 2):
        p.error(f"--steps {args.steps}: the {args.stage} stage needs an even number of at least 2 (a save at the "
                "middle step to resume from, another at the last)")
    if args.variant != "base" and args.stage not in ("train", "all"):
        p.error(f"--variant {args.variant} is for the train stage, not {args.stage}")
    if not args.limit_s > 0:
        p.error(f"--limit-s {args.limit_s:g}: must be above 0 seconds")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out} is a file, not a folder; choose another path")
    return args


@cli
def main(argv=None) -> int:
    args = parse(argv)
    if not args.cpu_smoke:
        require_cuda()
    check_writable_dir(args.out, "--out")
    out = args.out.resolve()  # the runs start in it: a relative path would point inside itself
    out.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (6 if args.cpu_smoke else 20)  # 6: quiet steps on both sides of the mid-run save
    c = Check(out, args.cpu_smoke, steps, args.limit_s, args.variant)
    failed = [name for name in (STAGES if args.stage == "all" else [args.stage]) if not STAGES[name](c)]
    if failed:
        print(f"gpu_check: the run of {', '.join(failed)} failed or ran past --limit-s (ok=false in "
              f"{out / 'results.jsonl'})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    exit_process(main())
