#!/usr/bin/env bash
# Downloads into .gpu-wheels/ (git-ignored) the wheels a lent GPU box lacks: it has torch, transformers and
# accelerate with CUDA, but no google-cloud-storage, google-auth or google-crc32c, and no network. Carry the
# folder with the device tool (carry: [".gpu-wheels"]); benchmarks/gpu_check.sh installs them first.
#   benchmarks/gpu_wheels.sh [--python-version 3.11]
set -euo pipefail
# Ctrl-C: the Python child stops cleanly and may exit 0; the script must stop too, with 130, not go on.
trap 'echo "error: interrupted" >&2; exit 130' INT TERM
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=python3
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
pyver=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) [[ "${2:-}" =~ ^3\.[0-9]{1,2}$ ]] \
                        || { echo "error: --python-version needs a version like 3.11, got '${2:-}'" >&2; exit 2; }
                      pyver=$2; shift 2 ;;
    *) echo "error: unknown argument '$1' (allowed: --python-version X.Y)" >&2; exit 2 ;;
  esac
done
[ -n "$pyver" ] || pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
"$PY" -m pip download --quiet --dest "$ROOT/.gpu-wheels" --only-binary=:all: --platform manylinux2014_x86_64 \
  --python-version "$pyver" google-cloud-storage google-crc32c
echo "wheels in $ROOT/.gpu-wheels ($(ls "$ROOT/.gpu-wheels" | wc -l) files)"
