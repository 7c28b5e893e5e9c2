#!/usr/bin/env bash
# nanoGPT's shakespeare-char CPU recipe on nanoGPT's own split, and (with --vs-nanogpt) nanoGPT itself right after.
#
#   benchmarks/shakespeare_char.sh [--vs-nanogpt PATH-TO-NANOGPT-CHECKOUT] [--presets LIST]
#   benchmarks/shakespeare_char.sh --vs-nanogpt PATH --budget-ratios 0.3,1.0 [--budget-preset NAME]
#
# --budget-ratios: nanoGPT runs first; then our budgeted recipe (--budget-preset, default shakespeare-char-budget)
# once per ratio, with --time-budget = ratio x nanoGPT's wall time (prepare + train) less our own prepare_data.py's
# time, so that our wall time end to end is within ratio x nanoGPT's; one line per ratio:
#   at 0.30x nanoGPT's time (39.0 s): val loss 1.8412 (nanoGPT 1.9030), wall 38.2 s
#
# --presets: our presets to run, comma-separated (default shakespeare-char-fast,shakespeare-char-best; add
# shakespeare-char for nanoGPT's recipe on our trainer, the like-for-like row).
# Data: ../shared/data/tinyshakespeare/input.txt (or $SHAKESPEARE_TEXT: any text, e.g. another character-level
# corpus; $SAMPLE_PROMPT sets the final sample's prompt, default ROMEO:); the first 90% of the characters train,
# the last 10% val (prepare_data.py --val-split tail), char tokenizer: nanoGPT's 65 characters plus <|endoftext|>.
# shakespeare-char-fast and shakespeare-char-best are the time-to-quality recipes (benchmarks/README.md: a cheaper
# model, Muon for its matrices), -fast the fewest steps to nanoGPT's loss, -best longer, sized to end inside
# nanoGPT's wall time; shakespeare-char is nanoGPT's own recipe on our trainer. Each of our runs is timed as a user
# waits for it (prepare + train.py, start-up, evals, saves and the final sample included).
# Val loss is estimated as nanoGPT's estimate_loss does (random 64-token windows of val, here 200 batches
# of 12 with a fixed seed) and over all of val in consecutive blocks. Wall time: prepare + train, end to end.
# nanoGPT runs its README's CPU command on a copy of the checkout (its prepare.py reads the same text), one after
# the other on the same box; its step-2000 checkpoint is then scored on the same val blocks with its own model.py.
# The last two lines: the wall time of our quickest run whose val loss is at or below nanoGPT's, against nanoGPT's;
# then our lowest val loss among the runs that ended within nanoGPT's wall time (exit 1 if there is none).
set -euo pipefail
# Ctrl-C: the Python child stops cleanly and may exit 0; the script must stop too, with 130, not go on.
trap 'echo "error: interrupted" >&2; exit 130' INT TERM
cd "$(dirname "$0")/.."
NANOGPT=""
PRESETS=shakespeare-char-fast,shakespeare-char-best
RATIOS=""
BUDGET_PRESET=shakespeare-char-budget
while [ $# -gt 0 ]; do
  case "$1" in
    --vs-nanogpt) [ $# -ge 2 ] || { echo "error: --vs-nanogpt needs a path to a nanoGPT checkout" >&2; exit 2; }
                  NANOGPT=$2; shift 2 ;;
    --presets) [ $# -ge 2 ] || { echo "error: --presets needs a comma-separated list of presets" >&2; exit 2; }
               PRESETS=$2; shift 2 ;;
    --budget-ratios) [ $# -ge 2 ] || { echo "error: --budget-ratios needs a list such as 0.3,1.0" >&2; exit 2; }
                     RATIOS=$2; shift 2 ;;
    --budget-preset) [ $# -ge 2 ] || { echo "error: --budget-preset needs a preset name" >&2; exit 2; }
                     BUDGET_PRESET=$2; shift 2 ;;
    *) echo "error: unknown argument $1 (allowed: --vs-nanogpt PATH, --presets LIST, --budget-ratios LIST," \
            "--budget-preset NAME)" >&2; exit 2 ;;
  esac
done
[ -n "${PRESETS//,/}" ] || { echo "error: --presets '$PRESETS' names no preset" >&2; exit 2; }
if [ -n "$RATIOS" ]; then
  [ -n "$NANOGPT" ] || { echo "error: --budget-ratios needs --vs-nanogpt PATH (the budgets are ratios of its time)" >&2
                         exit 2; }
  for r in ${RATIOS//,/ }; do
    [[ "$r" =~ ^[0-9]+(\.[0-9]+)?$ ]] && [ "$(echo "$r > 0" | bc)" = 1 ] || {
      echo "error: --budget-ratios '$RATIOS': '$r' is not a positive number (e.g. 0.3,1.0)" >&2; exit 2; }
  done
  PRESETS=$BUDGET_PRESET  # the fixed-step presets are not run in this mode
fi
TEXT=${SHAKESPEARE_TEXT:-../shared/data/tinyshakespeare/input.txt}
[ -f "$TEXT" ] || { echo "error: $TEXT not found (see ../shared/data/PROVENANCE.md)" >&2; exit 2; }
if [ -n "$NANOGPT" ] && ! [ -f "$NANOGPT/train.py" -a -f "$NANOGPT/data/shakespeare_char/prepare.py" ]; then
  echo "error: --vs-nanogpt $NANOGPT is not a nanoGPT checkout (no train.py and data/shakespeare_char/prepare.py)" >&2
  exit 2
fi
[ -x .venv/bin/python ] || { echo "error: no .venv here: run ./setup.sh first" >&2; exit 2; }
PY=$PWD/.venv/bin/python
for preset in ${PRESETS//,/ }; do  # a typo is one line now, not after the first preset's run
  $PY train.py --config "$preset" --print-plan > /dev/null || exit $?
done
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
seconds_since() { echo "$(date +%s.%N) - $1" | bc; }

# One of our runs as a user runs it, timed end to end; its final model scored on the shared val blocks.
for preset in $([ -z "$RATIOS" ] && echo "${PRESETS//,/ }"); do
  start=$(date +%s.%N)
  $PY prepare_data.py "$TEXT" --name "$preset" --out-dir "$OUT/data" --tokenizer char --val-split tail
  $PY train.py --config "$preset" --data "$OUT/data/$preset" --output-dir "$OUT/ckpt" --log-dir "$OUT/logs" \
    --run-name "$preset" --sample-prompt "${SAMPLE_PROMPT:-ROMEO:}"
  secs=$(seconds_since "$start")
  scores=$(PYTHONPATH=$PWD $PY benchmarks/char_val_loss.py piconeox "$OUT/ckpt/$preset/final" "$OUT/data/$preset")
  read -r random full <<< "$scores"  # not `<<< "$(...)"`: set -e ignores a failed substitution there
  echo "piconeox $preset: val loss $random (nanoGPT's estimate: 200 x 12 random blocks of 64), $full (all of val)," \
       "wall time $(printf %.1f "$secs") s (prepare + train)"
  echo "$preset $random $secs" >> "$OUT/ours.txt"
done

if [ -z "$NANOGPT" ]; then
  echo "nanoGPT: skipped (no --vs-nanogpt PATH given). Reference on a 2-core box: val loss 1.9030 on these blocks" \
       "in 77-99 s (README, ../shared/anchors/PROVENANCE.md)."
  exit 0
fi
mkdir "$OUT/nanogpt"
tar -C "$NANOGPT" --exclude=.git -cf - . | tar -C "$OUT/nanogpt" -xf -
chmod -R u+w "$OUT/nanogpt"  # a read-only checkout: its prepare.py writes next to itself
cp "$TEXT" "$OUT/nanogpt/data/shakespeare_char/input.txt"  # its prepare.py downloads only when the file is missing
start=$(date +%s.%N)
# nanoGPT's README CPU command; --always_save_checkpoint=True so its step-2000 model is scored as ours is.
(cd "$OUT/nanogpt" && $PY data/shakespeare_char/prepare.py && $PY train.py config/train_shakespeare_char.py \
  --device=cpu --compile=False --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 \
  --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0 --always_save_checkpoint=True \
  --out_dir="$OUT/nanogpt-out") > "$OUT/nanogpt.log" 2>&1 || { tail -20 "$OUT/nanogpt.log" >&2; exit 1; }
nano_s=$(seconds_since "$start")
nano_own=$(grep -o 'val loss [0-9.]*' "$OUT/nanogpt.log" | tail -1 | cut -d' ' -f3)
scores=$($PY benchmarks/char_val_loss.py nanogpt "$OUT/nanogpt-out" "$OUT/nanogpt" | tail -1)  # its model.py prints first
read -r nano_random nano_full <<< "$scores"
echo "nanoGPT shakespeare-char: val loss ${nano_random} (the same 200 x 12 blocks; its own 20-batch estimate printed"\
" ${nano_own:-?}), ${nano_full} (all of val), wall time $(printf %.1f "$nano_s") s (prepare + train)"
if [ -n "$RATIOS" ]; then
  lines=()
  for r in ${RATIOS//,/ }; do
    budget=$(echo "$r * $nano_s" | bc -l)
    name="$BUDGET_PRESET-$r"
    start=$(date +%s.%N)
    $PY prepare_data.py "$TEXT" --name "$name" --out-dir "$OUT/data" --tokenizer char --val-split tail
    left=$(echo "$budget - ($(date +%s.%N) - $start)" | bc -l)  # our own prepare counts against the budget
    $PY train.py --config "$BUDGET_PRESET" --time-budget "$(printf %.2f "$left")" --data "$OUT/data/$name" \
      --output-dir "$OUT/ckpt" --log-dir "$OUT/logs" --run-name "$name" --sample-prompt "${SAMPLE_PROMPT:-ROMEO:}"
    secs=$(seconds_since "$start")
    scores=$(PYTHONPATH=$PWD $PY benchmarks/char_val_loss.py piconeox "$OUT/ckpt/$name/final" "$OUT/data/$name")
    read -r random full <<< "$scores"
    lines+=("at $(printf %.2f "$r")x nanoGPT's time ($(printf %.1f "$budget") s): val loss $random (nanoGPT"\
" $nano_random), wall $(printf %.1f "$secs") s")
    echo "${lines[-1]}; over all of val $full; load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
  printf '%s\n' "${lines[@]}"
  exit 0
fi
# Our quickest run that reached nanoGPT's final val loss (on the same blocks).
read -r preset random secs <<< "$(awk -v n="$nano_random" '$2 <= n' "$OUT/ours.txt" | sort -g -k3 | head -1)"
if [ -z "${secs:-}" ]; then
  echo "time to nanoGPT's loss: not reached (nanoGPT $nano_random; ours $(cut -d' ' -f1,2 "$OUT/ours.txt" | paste -sd' '))"
  exit 1
fi
echo "quickest to nanoGPT's val loss $nano_random: piconeox $preset ($random)"
echo "time to nanoGPT's loss: $(printf %.1f "$secs") s (ours) vs $(printf %.1f "$nano_s") s (nanoGPT's run), ratio"\
" $(echo "scale=4; $secs / $nano_s" | bc | xargs printf %.2f)"
# Our lowest val loss among the runs that ended within nanoGPT's wall time (each preset is sized to it; none is cut).
read -r preset random secs <<< "$(awk -v t="$nano_s" '$3 <= t' "$OUT/ours.txt" | sort -g -k2 | head -1)"
if [ -z "${secs:-}" ]; then
  echo "best in nanoGPT's time: none of ours ended within $(printf %.1f "$nano_s") s (nanoGPT $nano_random)"
  exit 1
fi
echo "lowest val loss within nanoGPT's $(printf %.1f "$nano_s") s: piconeox $preset in $(printf %.1f "$secs") s"
echo "best in nanoGPT's time: $preset val loss $random (nanoGPT $nano_random)"
