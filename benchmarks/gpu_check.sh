#!/usr/bin/env bash
# One command for a GPU machine: how fast this box trains, and whether a resume is exact.
#
#   benchmarks/gpu_check.sh [--steps N] [--presets "small production"] [--out DIR]
#
# For each preset, on one GPU through ./start_training.sh --gpus 1, with bf16 autocast, torch.compile and
# fused AdamW (train.py's choices on CUDA), it prints:
#   tok/s and MFU (median over the steps after the first 5, which include compilation), peak GPU memory
#   (torch's allocator), the median step time with and without a background checkpoint save in flight
#   (saves every N/3 steps; "with" = the 2 steps right after each save), and an exact-resume check: the run
#   resumed from its step-N/3 checkpoint against the same steps of the straight run (max |loss difference|).
# Data: the built-in demo corpus with the byte tokenizer. The model keeps its preset vocabulary (production:
# --set model.vocab_size=50304), so FLOPs and memory are the preset's; the global batch is 2 micro batches.
# Without a CUDA GPU it refuses in one line (exit 2).
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=python3
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"

steps=30 presets="small production" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) [[ "${2:-}" =~ ^[0-9]+$ ]] && [ "$2" -ge 9 ] || die "--steps '${2:-}' must be a whole number >= 9"; steps=$2; shift 2 ;;
    --presets) [ -n "${2:-}" ] || die "--presets needs a value, e.g. \"small production\""; presets=$2; shift 2 ;;
    --out) [ -n "${2:-}" ] || die "--out needs a folder"; out=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (allowed: --steps N, --presets \"NAMES\", --out DIR)" ;;
  esac
done

"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
  || die "benchmarks/gpu_check.sh measures a CUDA GPU and torch sees none on this machine; run it on a GPU machine"

out=${out:-$(mktemp -d -t gpu_check.XXXXXX)}
mkdir -p "$out"
every=$((steps / 3))

for preset in $presets; do
  case "$preset" in
    production) shape=(--set model.vocab_size=50304) ;;
    *) shape=() ;;
  esac
  common=(--config "$preset" --gpus 1 --mixed-precision bf16 --data demo --max-steps "$steps" --
          --set train.tokenizer=byte "${shape[@]}" --set train.grad_accum_steps=2 --set train.global_batch_tokens=0
          --compile on --log-every 1 --eval-every "$steps" --set train.eval_batches=2 --save-every "$every"
          --warmup-steps 5 --output-dir "$out/ckpt" --log-dir "$out/logs")
  echo "== $preset: $steps steps straight (saves every $every), then resumed from step $every" >&2
  (cd "$out" && "$ROOT/start_training.sh" "${common[@]}" --run-name "$preset") >"$out/$preset.out" 2>&1 \
    || { tail -n 20 "$out/$preset.out" >&2; die "the $preset run failed (log: $out/$preset.out)"; }
  mkdir -p "$out/resumed/ckpt"
  (cd "$out" && "$ROOT/start_training.sh" "${common[@]}" --run-name "$preset" --output-dir "$out/resumed/ckpt" \
      --log-dir "$out/resumed/logs" --resume "$out/ckpt/$preset/step-$(printf %08d "$every")") \
    >"$out/$preset-resumed.out" 2>&1 \
    || { tail -n 20 "$out/$preset-resumed.out" >&2; die "the resumed $preset run failed (log: $out/$preset-resumed.out)"; }
done

"$PY" - "$out" "$steps" "$every" $presets <<'EOF'
import json, re, statistics, sys
from pathlib import Path

out, steps, every, presets = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
print(f"{'preset':<12}{'tok/s':>10}{'MFU':>8}{'peak GB':>9}{'step s':>9}{'step s, save in flight':>24}{'resume max |dloss|':>20}")
for preset in presets:
    rows = [r for r in json.loads((out / "logs" / preset / "history.json").read_text()) if "train/loss" in r]
    by_step = {r["step"]: r for r in rows}
    warm = [r for r in rows if r["step"] > 5]
    after_save = {s + k for s in range(every, steps, every) for k in (1, 2)}
    quiet = [r["train/step_time_s"] for r in warm if r["step"] not in after_save]
    busy = [r["train/step_time_s"] for r in warm if r["step"] in after_save]
    resumed = [r for r in json.loads((out / "resumed" / "logs" / preset / "history.json").read_text())
               if "train/loss" in r and r["step"] > every]
    diff = max(abs(r["train/loss"] - by_step[r["step"]]["train/loss"]) for r in resumed)
    peak = re.search(r"peak GPU memory ([\d.]+) GB", (out / "logs" / preset / "training.log").read_text())
    mfus = [r["train/mfu"] for r in warm if r.get("train/mfu") is not None]  # absent for GPUs of unknown peak
    mfu = statistics.median(mfus) if mfus else float("nan")
    print(f"{preset:<12}{statistics.median(r['train/tokens_per_s'] for r in warm):>10,.0f}{mfu:>8.1%}"
          f"{float(peak.group(1)) if peak else float('nan'):>9.1f}{statistics.median(quiet):>9.3f}"
          f"{statistics.median(busy) if busy else float('nan'):>24.3f}{diff:>20.2e}")
print(f"(runs and logs in {out})")
EOF
