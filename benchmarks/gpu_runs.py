"""gpu_check's training runs: one trimmed run of train.py through ./start_training.sh, bounded by --limit-s (past it
every process of the run is killed and the run counts as failed), and what its logs say: losses, tok/s, MFU, memory,
recompiles, graph breaks, each save's blocking seconds."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from tests.support.chaos import alive, tree

ROOT = Path(__file__).resolve().parent.parent
CPU_PRESET = ["--config", "test", "--gpus", "0", "--data", "demo", "--",
              "--set", "model.num_layers=1", "--set", "model.hidden_size=32", "--set", "model.num_heads=4",
              "--set", "model.intermediate_size=64", "--seq-len", "32", "--batch-size", "4",
              "--set", "train.tokenizer=byte", "--set", "train.tokenizer_vocab=null", "--compile", "off"]
# the production shape and micro batch, bf16, compiled; the byte-level demo corpus (no network on a lent box)
GPU_PRESET = ["--config", "production", "--gpus", "1", "--mixed-precision", "bf16", "--data", "demo", "--",
              "--set", "train.tokenizer=byte", "--set", "train.tokenizer_vocab=null",
              "--set", "model.vocab_size=50304", "--compile", "on"]


class Run(NamedTuple):
    ok: bool  # exited 0 within the limit
    wall_s: float
    log_dir: Path  # logs/NAME: training.log, history.json
    output: Path  # what the launcher printed (with TORCH_LOGS' recompiles and graph breaks)


def run_train(out: Path, name: str, cpu: bool, limit_s: float, extra: list[str], fsdp: bool = False) -> Run:
    """One run of the check's preset via the launcher, at most `limit_s` seconds; a resume (--resume in `extra`)
    continues run `name` and writes its output beside the first run's, to NAME-resumed.out."""
    preset = list(CPU_PRESET if cpu else GPU_PRESET)
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
    resumed = "--resume" in extra
    if not resumed:  # a stage run again in the same DIR starts its runs afresh
        for folder in (out / "ckpt" / name, out / "logs" / name):
            shutil.rmtree(folder, ignore_errors=True)
    env = {**os.environ, "TORCH_LOGS": "recompiles,graph_breaks", "PICONEOX_CPU_FSDP": "1" if fsdp else "0",
           **({"OMP_NUM_THREADS": "1"} if cpu else {})}  # a tiny model gains nothing from threads (they spin)
    output = out / f"{name}{'-resumed' if resumed else ''}.out"
    start = time.monotonic()
    with open(output, "w") as log:
        proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # past the limit, or Ctrl-C here: nothing of the run outlives the check
            if proc.poll() is None:
                kill_run(proc)
    wall = time.monotonic() - start
    if code is None:
        print(f"{name}: past its limit of {limit_s:g} s (--limit-s): every process of the run killed after "
              f"{wall:.0f} s; its output: {output}", file=sys.stderr)
    elif code:
        print(f"{name}: failed (exit {code}); last lines of {output}:", file=sys.stderr)
        print("\n".join(read(output).splitlines()[-15:]), file=sys.stderr)
    return Run(code == 0, wall, out / "logs" / name, output)


def kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process below it (torchrun starts its workers in sessions of their own, out of
    reach of a process-group kill); a run lock held by a dead process is taken over by the next run."""
    for pid in alive(tree(proc.pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def read(path: Path) -> str:
    """A log's text; empty when the run never wrote it (refused, or killed before)."""
    return path.read_text(errors="replace") if path.exists() else ""


def history(log_dir: Path) -> dict[int, dict]:
    text = read(log_dir / "history.json")
    return {r["step"]: r for r in (json.loads(text) if text else []) if "train/loss" in r}


def max_dloss(a: dict[int, dict], b: dict[int, dict], after: int) -> float | None:
    common = [s for s in a if s in b and s > after]
    return max(abs(a[s]["train/loss"] - b[s]["train/loss"]) for s in common) if common else None


def speed(run: Run) -> dict:
    """The keys gpu_results.RUN: build/compile/first step, steady tok/s and MFU (after step 2), peak memory,
    recompiles and graph breaks (TORCH_LOGS' lines in the launcher's output)."""
    rows = history(run.log_dir)
    warm = [r for s, r in rows.items() if s > 2]
    text = read(run.output)
    peak = re.search(r"peak GPU memory ([\d.]+) GB", text)
    mfus = [r["train/mfu"] for r in warm if r.get("train/mfu") is not None]
    return dict(ok=run.ok, wall_s=run.wall_s, first_step_s=rows[1]["train/step_time_s"] if 1 in rows else None,
                tok_s=statistics.median(r["train/tokens_per_s"] for r in warm) if warm else None,
                mfu=statistics.median(mfus) if mfus else None, peak_alloc_gb=float(peak.group(1)) if peak else None,
                peak_reserved_gb=max((r.get("gpu/mem_gb") or 0 for r in rows.values()), default=None) or None,
                recompiles=text.count("Recompiling function"), graph_breaks=text.count("Graph break"))


def blocking(log_dir: Path) -> dict:
    """The first save's blocking seconds (it allocates and pins the staging buffers) and the next one's (it reuses
    them: utils/ckpt/state.py Stager)."""
    found = [float(s) for s in re.findall(r"training blocked ([\d.]+) s", read(log_dir / "training.log"))]
    return dict(blocking_first_s=found[0] if found else None, blocking_later_s=found[1] if len(found) > 1 else None)


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
