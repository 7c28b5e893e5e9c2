"""The stages of benchmarks/gpu_check.sh (its CLI): each prints one JSON line per measurement to OUT/results.jsonl
and a readable row to stdout. See docs/gpus.md, "Checking a GPU box".

    python benchmarks/gpu_check.py STAGE --out DIR [--cpu-smoke]      STAGE: env, kernels, train, save, fsdp

--cpu-smoke runs every stage on the CPU with the tiny `test` preset (what the test suite runs): same keys, CPU
values (None where a measurement needs CUDA), so the script cannot rot unnoticed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_kernels import stage_env, stage_kernels  # noqa: E402
from benchmarks.gpu_results import GB, record  # noqa: E402
from utils.atomic import check_writable_dir  # noqa: E402
from utils.errors import CliParser, at_least, cli  # noqa: E402

# --- runs through ./start_training.sh ----------------------------------------------------------------------

def run_train(out: Path, name: str, cpu: bool, extra: list[str], fsdp: bool = False) -> tuple[bool, float, Path]:
    """One run of the check's preset via the launcher; returns (ok, wall seconds, its log dir)."""
    if cpu:
        preset = ["--config", "test", "--gpus", "0", "--data", "demo", "--",
                  "--set", "model.num_layers=1", "--set", "model.hidden_size=32", "--set", "model.num_heads=4",
                  "--set", "model.intermediate_size=64", "--seq-len", "32", "--batch-size", "4",
                  "--set", "train.tokenizer=byte", "--set", "train.tokenizer_vocab=null", "--compile", "off"]
    else:  # the production shape and micro batch, bf16, compiled; the byte-level demo corpus (no network here)
        preset = ["--config", "production", "--gpus", "1", "--mixed-precision", "bf16", "--data", "demo", "--",
                  "--set", "train.tokenizer=byte", "--set", "train.tokenizer_vocab=null",
                  "--set", "model.vocab_size=50304", "--compile", "on"]
    if fsdp:
        preset[preset.index("--"):preset.index("--")] = ["--accelerate-config",
                                                          str(ROOT / "configs/accelerate/fsdp_production.yaml")]
    cmd = [str(ROOT / "start_training.sh"), *preset, "--set", "train.grad_accum_steps=1",
           "--set", "train.global_batch_tokens=0", "--log-every", "1", "--warmup-steps", "2", "--keep-last", "1",
           "--set", "train.best_and_final=false",  # one checkpoint on disk per run (17 GB at 1.2B), nothing else
           # evaluation only at the last step (a run always ends with one), on one batch: its recompile is the
           # one cost of it, outside every measured step
           "--eval-every", "1000000", "--eval-batches", "1",
           "--report-to", "none", "--output-dir", str(out / "ckpt"), "--log-dir", str(out / "logs"),
           "--run-name", name, *extra]
    if "--resume" not in extra:  # a stage run again in the same DIR starts its runs afresh
        for folder in (out / "ckpt" / name, out / "logs" / name):
            shutil.rmtree(folder, ignore_errors=True)
    env = {**os.environ, "TORCH_LOGS": "recompiles,graph_breaks", "PICONEOX_CPU_FSDP": "1" if fsdp else "0",
           **({"OMP_NUM_THREADS": "1"} if cpu else {})}  # a tiny model gains nothing from threads (they spin)
    start = time.monotonic()
    with open(out / f"{name}.out", "w") as log:
        proc = subprocess.run(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=480)
    if proc.returncode:
        print(f"{name}: failed (exit {proc.returncode}); last lines of {out / f'{name}.out'}:", file=sys.stderr)
        print("\n".join((out / f"{name}.out").read_text().splitlines()[-15:]), file=sys.stderr)
    return proc.returncode == 0, time.monotonic() - start, out / "logs" / name


def history(log_dir: Path) -> dict[int, dict]:
    path = log_dir / "history.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    return {r["step"]: r for r in rows if "train/loss" in r}


def max_dloss(a: dict[int, dict], b: dict[int, dict], after: int) -> float | None:
    common = [s for s in a if s in b and s > after]
    return max(abs(a[s]["train/loss"] - b[s]["train/loss"]) for s in common) if common else None


VARIANTS = {"base": [], "micro_x2": ["--batch-size", "8"], "compile_off": ["--compile", "off"]}


def stage_train(out: Path, cpu: bool, steps: int, variant: str = "base") -> None:
    """Production on one GPU, one run: build/compile/first step, steady tok/s and MFU, memory, recompiles
    (`--variant micro_x2` or `compile_off` for a second command)."""
    name = "train-base" if variant == "base" else f"train-{variant}"
    ok, wall, log_dir = run_train(out, name, cpu, ["--max-steps", str(steps), "--save-every", str(10 * steps),
                                                   *([] if cpu else VARIANTS[variant])])
    rows = history(log_dir)
    warm = [r for s, r in rows.items() if s > 2]
    text = (out / f"{name}.out").read_text()
    peak = re.search(r"peak GPU memory ([\d.]+) GB", text)
    mfus = [r["train/mfu"] for r in warm if r.get("train/mfu") is not None]
    record(out, "train", variant=variant, micro_batch=8 if variant == "micro_x2" else 4,
           compile=not cpu and variant != "compile_off", ok=ok, wall_s=wall,
           first_step_s=rows[1]["train/step_time_s"] if 1 in rows else None,
           tok_s=statistics.median(r["train/tokens_per_s"] for r in warm) if warm else None,
           mfu=statistics.median(mfus) if mfus else None,
           peak_alloc_gb=float(peak.group(1)) if peak else None,
           peak_reserved_gb=max((r.get("gpu/mem_gb") or 0 for r in rows.values()), default=None) or None,
           recompiles=text.count("Recompiling function"), graph_breaks=text.count("Graph break"))
    shutil.rmtree(out / "ckpt" / name, ignore_errors=True)  # disk: only the save stage keeps a checkpoint


def blocked_seconds(log_dir: Path) -> float | None:
    found = re.findall(r"training blocked ([\d.]+) s", (log_dir / "training.log").read_text())
    return float(found[0]) if found else None


def steps_during_write(rows: dict[int, dict], saved: int, blocking: float, write_s: float) -> list[int]:
    """The steps that ran entirely while the write started after step `saved` went on: the step right after the
    save holds its blocking copy (the write starts when that ends), and the steps after it count while their
    cumulative time stays within the write's."""
    if saved + 1 not in rows:
        return []
    spent, busy = rows[saved + 1]["train/step_time_s"] - blocking, []
    for step in sorted(s for s in rows if s > saved + 1):
        spent += rows[step]["train/step_time_s"]
        if spent > write_s:
            break
        busy.append(step)
    return busy


def stage_save(out: Path, cpu: bool, steps: int) -> None:
    """One run with a save mid-run (keep_last 2: the resume stage starts from it): blocking seconds, write and
    crc32c GB/s, step time during the write against the other steps, staged GB; the run's losses against the train
    stage's base run (the noise floor, not zero: GPU kernels vary; None without a train stage of these --steps)."""
    from utils.ckpt.format import step_dir_name
    from utils.crc import crc32c_file

    every = steps // 2
    _, _, a = run_train(out, "save-a", cpu, ["--max-steps", str(steps), "--save-every", str(every), "--keep-last", "2"])
    straight = history(out / "logs" / "train-base")
    folder = out / "ckpt" / "save-a" / step_dir_name(every)
    rows, blocking = history(a), blocked_seconds(a)
    write = re.search(rf"saved checkpoint \S+{step_dir_name(every)} \(([\d.]+) s\)", (a / "training.log").read_text())
    write_s = float(write.group(1)) if write else None
    shards = [p for p in folder.glob("*.distcp")] if folder.is_dir() else []
    size = sum(p.stat().st_size for p in folder.iterdir()) if folder.is_dir() else 0
    staged = sum(p.stat().st_size for p in shards)
    start = time.monotonic()
    for p in shards:
        crc32c_file(p)
    crc_s = time.monotonic() - start
    busy = steps_during_write(rows, every, blocking or 0.0, write_s or 0.0)
    quiet = [rows[s]["train/step_time_s"] for s in rows if s > 2 and s != every + 1 and s not in busy]
    ratio = statistics.median(rows[s]["train/step_time_s"] for s in busy) / statistics.median(quiet) \
        if busy and quiet else None
    record(out, "save", blocking_s=blocking, write_s=write_s,
           write_gb_per_s=size / GB / write_s if write_s else None,
           crc32c_gb_per_s=staged / GB / crc_s if crc_s > 0 else None,
           step_ratio_during_write=ratio, steps_during_write=len(busy), staged_gb=staged / GB, checkpoint_gb=size / GB,
           noise_floor_max_dloss=max_dloss(rows, straight, 0) if max(straight, default=0) == steps else None)
    shutil.rmtree(out / "ckpt" / "save-a" / step_dir_name(steps), ignore_errors=True)  # the resume needs `every` only


def stage_resume(out: Path, cpu: bool, steps: int) -> None:
    """One run resumed from the save stage's mid-run checkpoint: its losses against the save stage's own."""
    from utils.ckpt.format import step_dir_name

    every = steps // 2
    folder = out / "ckpt" / "save-a" / step_dir_name(every)
    if not folder.is_dir():
        raise SystemExit(f"error: {folder} is missing: run the save stage (same --out and --steps) first")
    saved = history(out / "logs" / "save-a")  # read before the resume appends to the same run's history
    ok, _, r = run_train(out, "save-a", cpu, ["--max-steps", str(steps), "--save-every", str(10 * steps),
                                              "--resume", str(folder)])
    record(out, "resume", ok=ok, resume_max_dloss=max_dloss(history(r), saved, every))
    shutil.rmtree(out / "ckpt", ignore_errors=True)


def stage_fsdp(out: Path, cpu: bool, steps: int) -> None:
    """FSDP2 with configs/accelerate/fsdp_production.yaml on 1 GPU (CPU mode: 1 process, a gloo group of one; 2 ranks
    are tests/ranks/test_fsdp.py's): save and resume, with 2 micro-steps per step as production accumulates (the
    first without gradient sync, parameters kept gathered: utils/sharding.py)."""
    from utils.ckpt.format import step_dir_name

    every = steps // 2
    common = ["--max-steps", str(steps), "--eval-every", str(10 * steps), "--grad-accum", "2"]
    ok, _, a = run_train(out, "fsdp", cpu, [*common, "--save-every", str(every), "--keep-last", "2"], fsdp=True)
    folder = out / "ckpt" / "fsdp" / step_dir_name(every)
    size = sum(p.stat().st_size for p in folder.iterdir()) / GB if folder.is_dir() else None
    ok_r, _, r = run_train(out, "fsdp-resumed", cpu, [*common, "--save-every", str(10 * steps), "--resume",
                                                       str(folder)], fsdp=True)
    record(out, "fsdp", ok=ok and ok_r, blocking_s=blocked_seconds(a), checkpoint_gb=size,
           resume_max_dloss=max_dloss(history(r), history(a), every))
    shutil.rmtree(out / "ckpt", ignore_errors=True)


STAGES = {"env": stage_env, "kernels": stage_kernels, "train": stage_train, "save": stage_save,
          "resume": stage_resume, "fsdp": stage_fsdp}


@cli
def main(argv=None) -> int:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=[*STAGES, "all"])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--cpu-smoke", action="store_true")
    p.add_argument("--steps", type=at_least(1), default=None,
                   help="training steps per run (default 20 on a GPU, 6 on CPU)")
    p.add_argument("--variant", choices=VARIANTS, default="base", help="the train stage's run (default base)")
    args = p.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out} is a file, not a folder; choose another path")
    check_writable_dir(args.out, "--out")
    args.out = args.out.resolve()  # the runs start in it: a relative path would point inside itself
    args.out.mkdir(parents=True, exist_ok=True)
    steps = args.steps or (6 if args.cpu_smoke else 20)  # 6: quiet steps on both sides of the mid-run save
    for name in STAGES if args.stage == "all" else [args.stage]:
        fn = STAGES[name]
        if name in ("env", "kernels"):
            fn(args.out, args.cpu_smoke)
        elif name == "train":
            fn(args.out, args.cpu_smoke, steps, args.variant)
        else:
            fn(args.out, args.cpu_smoke, steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
