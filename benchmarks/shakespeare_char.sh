#!/usr/bin/env bash
# nanoGPT's shakespeare-char CPU recipe on ../shared/data/tinyshakespeare: char tokenizer, 90/10 split,
# 4 layers x 4 heads x 128 embd, block 64, batch 12, 2000 iters, lr 1e-3. Prints final val loss and wall time.
# nanoGPT splits the text at the 90% character mark; prepare_data.py splits whole documents (paragraphs)
# 90/10 by seed, so the val texts differ and the numbers are comparable, not identical.
set -euo pipefail
cd "$(dirname "$0")/.."
TEXT=${SHAKESPEARE_TEXT:-../shared/data/tinyshakespeare/input.txt}
[ -f "$TEXT" ] || { echo "error: $TEXT not found (see ../shared/data/PROVENANCE.md)" >&2; exit 2; }
PY=.venv/bin/python
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
start=$(date +%s)
$PY prepare_data.py "$TEXT" --name shakespeare-char --out-dir "$OUT/data" --tokenizer char --val-fraction 0.1
$PY train.py --config shakespeare-char --data "$OUT/data/shakespeare-char" --output-dir "$OUT/ckpt" \
  --log-dir "$OUT/logs" --run-name shakespeare-char --sample-prompt "ROMEO:"
end=$(date +%s)
$PY - "$OUT/logs/shakespeare-char/history.json" "$((end - start))" <<'PY'
import json, sys
history = json.load(open(sys.argv[1]))
val = [h["val/loss"] for h in history if "val/loss" in h]
print(f"shakespeare-char: final val loss {val[-1]:.4f} (best {min(val):.4f}), wall time {int(sys.argv[2])} s "
      "(nanoGPT reports ~1.88 in ~3 min)")
PY
