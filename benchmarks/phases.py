"""Where a run's wall time goes: start-up, data preparation, model build, steps, evals, saves, sample, teardown.

    .venv/bin/python benchmarks/phases.py TEXT [--config shakespeare-char] [--set train.KEY=VALUE ...]
    .venv/bin/python benchmarks/phases.py demo --config pico-best      # the README's first command

A TEXT file is prepared first (prepare_data.py with the preset's tokenizer, --val-split tail, in a subprocess: its
own start-up counts); `demo` is prepared inside the run on first use, as on a fresh clone (the "data check/load"
row). Then train.py runs in this process (as a script) with its phases timed by wrapping the functions that do
them, and the bare loop of benchmarks/bench_train.py on the same shapes and math settings ends it, so the per-step
overhead shows.
Prints one markdown table of wall and CPU seconds (this process's, all threads). On a shared box the wall time
scales with the load (note `uptime` beside it); with OMP_NUM_THREADS=1 the CPU time is what an idle core would take.
"""
from __future__ import annotations

import argparse
import collections
import os
import runpy
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

from benchmarks.bench_train import WARMUP, bare_loop  # noqa: E402
from configs.presets import resolve_config  # noqa: E402
from configs.run import RunSettings  # noqa: E402
from utils import lm, optim  # noqa: E402,F401
from utils.ckpt import write as ckpt_write  # noqa: E402
from utils.ckpt.parts import Registry  # noqa: E402,F401
from utils.report import metrics, progress, summary  # noqa: E402,F401
from utils.ckpt import resume, uploader  # noqa: E402,F401
from utils.data import source  # noqa: E402
from utils.data.shards import read_manifest  # noqa: E402
from utils import errors  # noqa: E402
from utils.errors import CliParser, PiconeoxError, cli  # noqa: E402

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


def run_train(argv: list[str]) -> int:
    """`python train.py ARGV` in this process (as a script, as a user runs it: nothing of it is imported), so the
    wrapped functions time its phases; its exit code."""
    sys.argv = [str(REPO / "train.py"), *argv]
    real_exit, errors.exit_process = errors.exit_process, sys.exit  # its last line would end this process too
    try:
        runpy.run_path(str(REPO / "train.py"), run_name="__main__")
    except SystemExit as e:
        return e.code or 0
    finally:
        errors.exit_process = real_exit
    return 0


def prepare_text(text: Path, tc, tmp: Path) -> tuple[str, list]:
    """prepare_data.py on `text` (absolute: it runs in the repository) in a subprocess, its own start-up timed
    too: (the dataset folder, its row of the table)."""
    start, child = time.perf_counter(), os.times()
    vocab = ["--vocab-size", str(tc.tokenizer_vocab)] if tc.tokenizer_vocab else []
    done = subprocess.run([sys.executable, "prepare_data.py", str(text), "--name", "d", "--out-dir", f"{tmp}/data",
                           "--tokenizer", tc.tokenizer, *vocab, "--val-split", "tail"], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:  # prepare_data.py's own error line, not a CalledProcessError traceback
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PiconeoxError(f"preparing {text} failed: {last.removeprefix('error: ')}")
    after = os.times()
    cpu = after.children_user + after.children_system - child.children_user - child.children_system
    return f"{tmp}/data/d", [("data prep (prepare_data.py subprocess)", [time.perf_counter() - start, cpu])]


@cli
def main(argv=None) -> int:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", help="a text file, or demo (the built-in stories, prepared inside the run)")
    p.add_argument("--config", default="shakespeare-char")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--sample-prompt", help="default: ROMEO: for a text file, the run's own for demo")
    args = p.parse_args(argv)
    if bad := [kv for kv in args.set if "=" not in kv]:
        p.error(f"--set {bad[0]!r}: expected SECTION.KEY=VALUE, e.g. train.max_steps=100")
    cfg = resolve_config(args.config, None, dict(kv.split("=", 1) for kv in args.set))
    demo = args.text == "demo"
    if not demo and not Path(args.text).is_file():
        raise PiconeoxError(f"{args.text}: {'not a file' if Path(args.text).exists() else 'no such file'} (give a "
                            "text file, or demo)")
    timed(source, "local_dataset", "data check/load" + (" (demo prepared on first use)" if demo else ""))
    timed(lm, "evaluate", "evals")
    timed(Registry, "capture", "saves (blocking copy)")
    timed(summary, "log_sample", "final sample")
    timed(ckpt_write, "publish_final", "final checkpoint publish")
    timed(metrics.MetricsWriter, "plot", "loss plot + history")
    timed(metrics.MetricsWriter, "save_history", "loss plot + history")
    timed(uploader.CheckpointUploader, "close", "wait for saves")
    mark(lm, "to_device", "loop start", first=True)
    mark(progress.ProgressBar, "close", "loop end", first=False)
    with tempfile.TemporaryDirectory() as tmp:
        if demo:
            os.chdir(tmp)  # demo data goes to ./data: a fresh folder, so it is prepared as on a fresh clone
            data = tmp + "/data/" + source.data_name(cfg.train)
        else:
            data, prep = prepare_text(Path(args.text).absolute(), cfg.train, Path(tmp))
        flags = [f for kv in args.set for f in ("--set", kv)]
        prompt = args.sample_prompt or (RunSettings.sample_prompt if demo else "ROMEO:")
        start = now()
        code = run_train(["--config", args.config, "--data", "demo" if demo else data, "--output-dir", f"{tmp}/ckpt",
                          "--log-dir", f"{tmp}/logs", "--run-name", "r", "--sample-prompt", prompt, *flags])
        if code:
            os.chdir(REPO)  # as after a run (demo runs inside tmp)
            return code  # train.py printed its one error line
        total = since(start)
        vocab_size = read_manifest(data).vocab_size
        os.chdir(REPO)
    steps = cfg.train.max_steps
    loop = [e - s - a - b for e, s, a, b in zip(marks["loop end"], marks["loop start"], spent["evals"],
                                                 spent["saves (blocking copy)"])]
    torch.set_float32_matmul_precision(cfg.train.matmul_precision)
    cfg = type(cfg)(cfg.preset, cfg.model.with_vocab(vocab_size), cfg.train)
    start = now()
    bare = bare_loop(cfg, 100, attention=cfg.train.attention)
    bare_cpu = since(start)[1] / (100 + WARMUP)  # bench_train's warm-up steps included
    rows = [("imports: torch", [b - a for a, b in zip(T0, T_TORCH)]),
            ("imports: transformers, accelerate, piconeox", [b - a for a, b in zip(T_TORCH, T_IMPORTS)]),
            *([] if demo else prep), *sorted(spent.items()),
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
    sys.exit(main())
