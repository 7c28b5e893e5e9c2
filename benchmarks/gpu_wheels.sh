#!/usr/bin/env bash
# Downloads into .gpu-wheels/ (git-ignored) the one wheel a lent GPU box lacks that training needs: google-crc32c
# (a hard requirement: every checkpoint's COMPLETE marker records CRC32C). The box has torch, transformers and
# accelerate with CUDA, no network, and no google-cloud-storage, which only gs:// needs (not benchmarks/gpu_check.sh);
# its dependencies (requests, protobuf, ...) would shadow the box's own packages, so it is not fetched.
# Carry the folder with the device tool (carry: [".gpu-wheels"]); benchmarks/gpu_check.sh installs it first.
#   benchmarks/gpu_wheels.sh [--python-version X.Y]   the box's Python (default: this one's); e.g. 3.12
set -euo pipefail
die() { echo "error: $*" >&2; exit 2; }
# Ctrl-C: the Python child stops cleanly and may exit 0; the script must stop too, with 130, not go on.
trap 'echo "error: interrupted" >&2; exit 130' INT TERM
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=python3
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
pyver=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) [ $# -ge 2 ] || die "--python-version needs a value X.Y (e.g. 3.12)"; pyver=$2; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (allowed: --python-version X.Y)" ;;
  esac
done
[ -z "$pyver" ] && pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
[[ "$pyver" =~ ^3\.[0-9]{1,2}$ ]] || die "--python-version '$pyver' is not a Python 3 version X.Y (e.g. 3.12)"
"$PY" -m pip download --quiet --no-deps --dest "$ROOT/.gpu-wheels" --only-binary=:all: \
  --platform manylinux2014_x86_64 --python-version "$pyver" google-crc32c
echo "wheels in $ROOT/.gpu-wheels for Python $pyver: $(ls "$ROOT/.gpu-wheels" | tr '\n' ' ')"
