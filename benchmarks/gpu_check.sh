#!/usr/bin/env bash
# The check for a lent GPU box (one H100, 16 cores, 128 GB RAM, 64 GB disk, 10 minutes per command, no network):
# each stage is its own command (one trimmed run of train.py at most: no best/ or final/, one eval batch at the end);
# JSON lines go to OUT/results.jsonl, a readable row per line to stdout. Run the stages in order, one command each:
#
#   benchmarks/gpu_check.sh env         --out DIR   versions, GPU, free disk and RAM
#   benchmarks/gpu_check.sh kernels     --out DIR   bf16 GEMM TFLOP/s at production shapes, the SDPA backend torch
#                                                   runs, device-to-pinned-host GB/s (a save's blocking copy)
#   benchmarks/gpu_check.sh train       --out DIR   production on 1 GPU (bf16, compiled): first step, tok/s, MFU,
#                                                   memory, recompiles, graph breaks (--variant micro_x2 | compile_off)
#   benchmarks/gpu_check.sh save        --out DIR   saves at the middle and last step: the first and the later save's
#                                                   blocking s, write/crc32c GB/s, step time during the write; losses
#                                                   vs the train stage's run (the noise floor)
#   benchmarks/gpu_check.sh resume      --out DIR   resumes the save stage's checkpoint: losses vs the save stage's
#   benchmarks/gpu_check.sh fsdp        --out DIR   FSDP2 (configs/accelerate/fsdp_production.yaml) on 1 GPU, train
#                                                   and save: the train stage's numbers, both saves' blocking s
#   benchmarks/gpu_check.sh fsdp-resume --out DIR   resumes the fsdp stage's checkpoint: losses vs the fsdp stage's
#   benchmarks/gpu_check.sh all --cpu-smoke --out DIR   every stage on the CPU with a tiny model (the test suite's run)
#
# Options: --steps N (training steps per run; even, >= 2, for save, resume, fsdp, fsdp-resume), --limit-s S (each
# run's limit, default 480: past it every process of the run is killed, an ok=false line, exit 1). Without
# --cpu-smoke a torch that sees no CUDA GPU is refused (exit 2). google-crc32c, which the box lacks and every
# checkpoint needs, is installed first from .gpu-wheels/ (benchmarks/gpu_wheels.sh, carried to the box) into
# .gpu-site/ (no network).
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=python3
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
"$PY" -c 'import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ("torch", "transformers", "accelerate"))))' \
  || die "no .venv in $ROOT and $PY lacks torch/transformers/accelerate: run ./setup.sh first"
case "${1:-}" in
  env|kernels|train|save|resume|fsdp|fsdp-resume|all) ;;
  -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "stage '${1:-}' is not one of: env, kernels, train, save, resume, fsdp, fsdp-resume, all (see --help)" ;;
esac
# only google-crc32c goes into .gpu-site/ (first on the path): nothing there can shadow the box's own packages
if [ -d "$ROOT/.gpu-wheels" ] && ! "$PY" -c 'import google_crc32c' 2>/dev/null; then
  [ -d "$ROOT/.gpu-site" ] || "$PY" -m pip install --quiet --no-index --no-deps --find-links "$ROOT/.gpu-wheels" \
    --target "$ROOT/.gpu-site" google-crc32c || die "installing google-crc32c from .gpu-wheels/ failed"
  export PYTHONPATH="$ROOT/.gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" "$ROOT/benchmarks/gpu_check.py" "$@"
