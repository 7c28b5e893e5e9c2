"""What an EMA of the weights (train.ema_decay) buys: final val loss of the raw and the averaged weights, and the
training step time, for presets with and without it (benchmarks/README.md, "EMA of the weights").

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ema_effect.py --presets shakespeare-char-fast pico-best \
        --decays 0 0.999 0.99 [--set train.max_steps=1000]

The EMA does not change what the raw weights learn (same seed, same batches): a run with EMA reports both val
losses at each eval, the run without it gives the step time it costs. shakespeare-char-fast trains on
../shared/data/tinyshakespeare/input.txt (prepared as shakespeare_char.sh does), the pico presets on the demo.
Prints one JSON line per run: preset, decay, the last eval's val losses, the mean step time (train/seconds
per step, evals and saves not counted) and the wall time.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAKESPEARE = REPO.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def data_for(preset: str, root: Path) -> str:
    if not preset.startswith("shakespeare"):
        return "demo"
    if not (root / "data" / "shakespeare").is_dir():
        subprocess.run([sys.executable, "prepare_data.py", str(SHAKESPEARE), "--name", "shakespeare", "--out-dir",
                        str(root / "data"), "--tokenizer", "char", "--val-split", "tail"], cwd=REPO, check=True,
                       capture_output=True)
    return str(root / "data" / "shakespeare")


def one_run(preset: str, decay: float, root: Path, sets: list[str]) -> dict:
    name = f"{preset}-{decay:g}"
    cmd = [sys.executable, "train.py", "--config", preset, "--data", data_for(preset, root), "--output-dir",
           str(root / "ckpt"), "--log-dir", str(root / "logs"), "--run-name", name, "--set", f"train.ema_decay={decay}"]
    for kv in sets:
        cmd += ["--set", kv]
    start = time.monotonic()
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
    wall = time.monotonic() - start
    history = json.loads((root / "logs" / name / "history.json").read_text())
    last = [h for h in history if "val/loss" in h][-1]
    trainer = json.loads((root / "ckpt" / name / "final" / "trainer.json").read_text())
    return {"preset": preset, "decay": decay, "step": last["step"], "val_loss": round(last["val/loss"], 4),
            "ema_val_loss": round(last["val/loss_ema"], 4) if "val/loss_ema" in last else None,
            "step_ms": round(1000 * trainer["train_seconds"] / trainer["step"], 2), "wall_s": round(wall, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", default=["shakespeare-char-fast", "pico-best"])
    p.add_argument("--decays", nargs="+", type=float, default=[0.0, 0.999])
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="ema-") as tmp:
        for preset in args.presets:
            for decay in args.decays:
                print(json.dumps(one_run(preset, decay, Path(tmp), args.set)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
