"""Where a run's wall time goes: start-up, data preparation, model build, steps, evals, saves, sample, teardown.

    .venv/bin/python benchmarks/phases.py TEXT [--config shakespeare-char] [--set train.KEY=VALUE ...]

Prepares TEXT (prepare_data.py --tokenizer char --val-split tail, in a subprocess: its own start-up counts), then
runs train.main in this process with its phases timed by wrapping the functions that do them, and ends with the
bare loop of benchmarks/bench_train.py on the same shapes and math settings, so the per-step overhead shows.
Prints one markdown table of wall and CPU seconds (this process's, all threads). On a shared box the wall time
scales with the load (note `uptime` beside it); with OMP_NUM_THREADS=1 the CPU time is what an idle core would take.
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

def now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


T0 = now()
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402  the imports train.main does lazily, timed here as start-up

T_TORCH = now()
import accelerate  # noqa: E402,F401
import transformers  # noqa: E402,F401

import train  # noqa: E402
from benchmarks.bench_train import WARMUP, bare_loop  # noqa: E402
from configs.presets import resolve_config  # noqa: E402
from utils import ckpt, lm, metrics, optim, progress, summary  # noqa: E402,F401
from utils.ckpt import resume, uploader  # noqa: E402,F401
from utils.data import source  # noqa: E402

T_IMPORTS = now()
spent: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
marks: dict[str, tuple[float, float]] = {}


def since(start: tuple[float, float]) -> list[float]:
    return [b - a for a, b in zip(start, now())]


def timed(owner, name: str, phase: str) -> None:
    """Wrap owner.name so its wall time adds to `phase`."""
    fn = getattr(owner, name)

    def wrapper(*a, **kw):
        start = now()
        try:
            return fn(*a, **kw)
        finally:
            spent[phase] = [t + d for t, d in zip(spent[phase], since(start))]
    setattr(owner, name, wrapper)


def mark(owner, name: str, key: str, first: bool) -> None:
    """Record when owner.name is first (or last) called."""
    fn = getattr(owner, name)

    def wrapper(*a, **kw):
        if not (first and key in marks):
            marks[key] = now()
        return fn(*a, **kw)
    setattr(owner, name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text")
    p.add_argument("--config", default="shakespeare-char")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = p.parse_args()
    timed(source, "local_dataset", "data check/load")
    timed(lm, "evaluate", "evals")
    timed(ckpt.Checkpointer, "capture", "saves (blocking copy)")
    timed(summary, "log_sample", "final sample")
    timed(ckpt, "publish_final", "final checkpoint publish")
    timed(metrics.MetricsWriter, "plot", "loss plot + history")
    timed(metrics.MetricsWriter, "save_history", "loss plot + history")
    timed(uploader.CheckpointUploader, "close", "wait for saves")
    mark(lm, "to_device", "loop start", first=True)
    mark(progress.ProgressBar, "close", "loop end", first=False)
    with tempfile.TemporaryDirectory() as tmp:
        start, child = time.perf_counter(), os.times()
        subprocess.run([sys.executable, "prepare_data.py", args.text, "--name", "d", "--out-dir", f"{tmp}/data",
                        "--tokenizer", "char", "--val-split", "tail"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        after = os.times()
        cpu = after.children_user + after.children_system - child.children_user - child.children_system
        prep = [time.perf_counter() - start, cpu]
        flags = [f for kv in args.set for f in ("--set", kv)]
        start = now()
        assert train.main(["--config", args.config, "--data", f"{tmp}/data/d", "--output-dir", f"{tmp}/ckpt",
                           "--log-dir", f"{tmp}/logs", "--run-name", "r", "--sample-prompt", "ROMEO:", *flags]) == 0
        total = since(start)
    cfg = resolve_config(args.config, None, dict(kv.split("=", 1) for kv in args.set))
    steps = cfg.train.max_steps
    loop = [e - s - a - b for e, s, a, b in zip(marks["loop end"], marks["loop start"], spent["evals"],
                                                 spent["saves (blocking copy)"])]
    torch.set_float32_matmul_precision(cfg.train.matmul_precision)
    cfg = type(cfg)(cfg.preset, cfg.model.with_vocab(66), cfg.train)
    start = now()
    bare = bare_loop(cfg, 100, attention=cfg.train.attention)
    bare_cpu = since(start)[1] / (100 + WARMUP)  # bench_train's warm-up steps included
    rows = [("imports: torch", [b - a for a, b in zip(T0, T_TORCH)]),
            ("imports: transformers, accelerate, piconeox", [b - a for a, b in zip(T_TORCH, T_IMPORTS)]),
            ("data prep (prepare_data.py subprocess)", prep), *sorted(spent.items()),
            (f"training steps ({steps} x {loop[0] / steps * 1000:.1f} ms wall, {loop[1] / steps * 1000:.1f} ms CPU; "
             f"bare loop {bare * 1000:.1f} ms wall, {bare_cpu * 1000:.1f} ms CPU)", loop)]
    rows.append(("other (accelerate, dirs, logging, teardown in main)",
                 [t - sum(v[i] for v in spent.values()) - loop[i] for i, t in enumerate(total)]))
    print(f"\n{args.config} {' '.join(args.set)}, {torch.get_num_threads()} threads\n\n"
          "| phase | wall s | CPU s |\n|---|---|---|")
    for name, (wall, cpu) in rows:
        print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
    wall, cpu = (sum(r[1][i] for r in rows) for i in (0, 1))
    print(f"| **total** | {wall:.2f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
