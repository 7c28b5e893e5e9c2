#!/usr/bin/env bash
# The README's first command, as a user on a fresh clone runs it, against the same command at an earlier commit.
#
#   benchmarks/first_command.sh [--baseline REV] [--config PRESET]
#
# Each side is a copy of the tree (git archive of REV, and of the working tree's HEAD) with no data/, so the demo
# stories are prepared as on a fresh clone; both share this checkout's .venv. Each runs
# `./start_training.sh --config PRESET --gpus 0` (default pico-best), timed end to end; the demo val loss is the
# run's last evaluation. The baseline runs first, then HEAD, one after the other on the same box.
# The last line: `first command: A s, demo val loss X (HEAD) vs B s, Y (REV), ratio R`.
set -euo pipefail
# Ctrl-C: the Python child stops cleanly and may exit 0; the script must stop too, with 130, not go on.
trap 'echo "error: interrupted" >&2; exit 130' INT TERM
cd "$(dirname "$0")/.."
BASELINE=b73f96e  # the commit whose first command the README's "today" figures (3,000 steps, 0.305) describe
CONFIG=pico-best
while [ $# -gt 0 ]; do
  case "$1" in
    --baseline) [ $# -ge 2 ] || { echo "error: --baseline needs a git revision" >&2; exit 2; }
                BASELINE=$2; shift 2 ;;
    --config) [ $# -ge 2 ] || { echo "error: --config needs a preset name" >&2; exit 2; }
              CONFIG=$2; shift 2 ;;
    *) echo "error: unknown argument $1 (allowed: --baseline REV, --config PRESET)" >&2; exit 2 ;;
  esac
done
git rev-parse --verify -q "$BASELINE^{commit}" > /dev/null \
  || { echo "error: --baseline $BASELINE is not a commit of this repository" >&2; exit 2; }
[ -x .venv/bin/python ] || { echo "error: no .venv here: run ./setup.sh first" >&2; exit 2; }
.venv/bin/python train.py --config "$CONFIG" --print-plan > /dev/null || exit $?  # a typo: one line, exit 2
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# One side: a fresh copy of REV's tree, its first command timed, "SECONDS LOSS" printed.
first_command() {
  local rev=$1 dir="$OUT/$2"
  mkdir "$dir"
  git archive "$rev" | tar -C "$dir" -xf -
  ln -s "$PWD/.venv" "$dir/.venv"
  local start
  start=$(date +%s.%N)
  (cd "$dir" && ./start_training.sh --config "$CONFIG" --gpus 0) > "$dir.log" 2>&1 \
    || { tail -20 "$dir.log" >&2; exit 1; }
  local secs loss
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  loss=$(grep -ho 'val loss [0-9.]*' "$dir"/logs/*/training.log | tail -1 | cut -d' ' -f3)
  echo "$secs $loss"
}

# Assigned first: `set -e` stops on a failed command substitution only in an assignment, not inside `read <<<`.
base_run=$(first_command "$BASELINE" baseline)
read -r base_s base_loss <<< "$base_run"
echo "$BASELINE: $(printf %.1f "$base_s") s, demo val loss $base_loss"
head_run=$(first_command HEAD head)
read -r head_s head_loss <<< "$head_run"
echo "HEAD ($(git rev-parse --short HEAD)): $(printf %.1f "$head_s") s, demo val loss $head_loss"
echo "first command: $(printf %.1f "$head_s") s, demo val loss $head_loss (HEAD) vs $(printf %.1f "$base_s") s," \
     "$base_loss ($BASELINE), ratio $(echo "scale=4; $head_s / $base_s" | bc | xargs printf %.2f)"
