"""What an EMA of the weights (train.ema_decay) buys: final val loss of the raw and the averaged weights, and the
training step time, for presets with and without it (benchmarks/README.md, "EMA of the weights").

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ema_effect.py --presets shakespeare-char-fast pico-best \
        --decays 0 0.999 0.99 [--set train.max_steps=1000]

The EMA does not change what the raw weights learn (same seed, same batches): a run with EMA reports both val
losses at each eval, the run without it gives the step time it costs. shakespeare-char-fast trains on
../shared/data/tinyshakespeare/input.txt (prepared as shakespeare_char.sh does), the pico presets on the demo.
Prints one JSON line per run: preset, decay, the last eval's val losses, the mean step time (train/seconds
per step, evals and saves not counted) and the wall time. On a shared box wall times follow the load, so
`--update-cost` also times one EMA update against one bare training step of each preset (median CPU ms of
interleaved pairs in this process, benchmarks/bench_train.py's loop): what the EMA adds to a step on an idle core.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from configs.presets import PRESET_NAMES, resolve_config  # noqa: E402
from utils.errors import CliParser, PiconeoxError, cli  # noqa: E402

SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def checked_run(cmd: list[str], what: str) -> None:
    """Run `cmd` in the repository; its failure is one line (its own error line), not a CalledProcessError."""
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PiconeoxError(f"{what} failed (exit {done.returncode}): {last.removeprefix('error: ')}")


def data_for(preset: str, root: Path) -> str:
    if not preset.startswith("shakespeare"):
        return "demo"
    if not (root / "data" / "shakespeare").is_dir():
        checked_run([sys.executable, "prepare_data.py", str(SHAKESPEARE), "--name", "shakespeare", "--out-dir",
                     str(root / "data"), "--tokenizer", "char", "--val-split", "tail"], "preparing Tiny Shakespeare")
    return str(root / "data" / "shakespeare")


def one_run(preset: str, decay: float, root: Path, sets: list[str]) -> dict:
    name = f"{preset}-{decay:g}"
    cmd = [sys.executable, "train.py", "--config", preset, "--data", data_for(preset, root), "--output-dir",
           str(root / "ckpt"), "--log-dir", str(root / "logs"), "--run-name", name, "--set", f"train.ema_decay={decay}"]
    for kv in sets:
        cmd += ["--set", kv]
    start = time.monotonic()
    checked_run(cmd, f"the run {name}")
    wall = time.monotonic() - start
    history = json.loads((root / "logs" / name / "history.json").read_text())
    last = [h for h in history if "val/loss" in h][-1]
    trainer = json.loads((root / "ckpt" / name / "final" / "trainer.json").read_text())
    return {"preset": preset, "decay": decay, "step": last["step"], "val_loss": round(last["val/loss"], 4),
            "ema_val_loss": round(last["val/loss_ema"], 4) if "val/loss_ema" in last else None,
            "step_ms": round(1000 * trainer["train_seconds"] / trainer["step"], 2), "wall_s": round(wall, 1)}


def update_cost(preset: str, steps: int = 30) -> dict:
    """Median CPU ms of a bare training step and of one EMA update after it, interleaved (same cache state)."""
    import torch

    from configs.model import build_model
    from configs.presets import resolve_config
    from utils.ema import WeightEMA
    from utils.lm import lm_loss
    from utils.optim import build_optimizer

    torch.manual_seed(0)
    cfg = resolve_config(preset)
    vocab = {"char": 66, "byte": 256}.get(cfg.train.tokenizer, cfg.train.tokenizer_vocab)  # Shakespeare: 66 chars
    cfg = type(cfg)(cfg.preset, cfg.model.with_vocab(vocab), cfg.train)
    tc, model = cfg.train, build_model(cfg.model)
    opt, ema = build_optimizer(model, tc.learning_rate, tc.weight_decay, (0.9, 0.95)), WeightEMA(model, 0.999)
    step_ms, update_ms = [], []
    for _ in range(steps):
        x = torch.randint(0, cfg.model.vocab_size, (tc.micro_batch_size, tc.seq_len))
        t0 = time.process_time()
        lm_loss(model, x, x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.process_time()
        ema.update()
        step_ms.append(1000 * (t1 - t0))
        update_ms.append(1000 * (time.process_time() - t1))
    step, update = statistics.median(step_ms[5:]), statistics.median(update_ms[5:])
    return {"preset": preset, "bare_step_cpu_ms": round(step, 2), "ema_update_cpu_ms": round(update, 3),
            "overhead_pct": round(100 * update / step, 2)}


@cli
def main(argv=None) -> int:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", choices=PRESET_NAMES, default=["shakespeare-char-fast", "pico-best"],
                   metavar="PRESET")
    p.add_argument("--decays", nargs="+", type=float, default=[0.0, 0.999])
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--update-cost", action="store_true", help="only time an EMA update against a bare step")
    args = p.parse_args(argv)
    if bad := [kv for kv in args.set if "=" not in kv]:
        p.error(f"--set {bad[0]!r}: expected SECTION.KEY=VALUE, e.g. train.max_steps=100")
    overrides = dict(kv.split("=", 1) for kv in args.set)
    for preset in args.presets:  # every setting, before the first run trains for minutes
        for decay in args.decays:
            resolve_config(preset, None, {**overrides, "train.ema_decay": decay})
    if args.update_cost:
        for preset in args.presets:
            print(json.dumps(update_cost(preset)), flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="ema-") as tmp:
        for preset in args.presets:
            for decay in args.decays:
                print(json.dumps(one_run(preset, decay, Path(tmp), args.set)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
