"""Train Pico presets on TinyStories and print docs/pico.md's table: size, emulated speed and heap, val loss, a sample.

    .venv/bin/python benchmarks/pico_tinystories.py [--presets rp2040-quality,pico-best] [--out /tmp/pico-ts]
        [--train FILE] [--val FILE] [--tokens 16]

Data: ../shared/data/tinystories/ (the train file, and the published validation file as --val), with the
preset's tokenizer kind at the model's full vocab (char for a char preset). Each preset trains with its own
recipe (train.py --config NAME --data ...); a run whose final/ checkpoint exists is reused. Val loss is
PyTorch f32 over all of the validation file in consecutive blocks of the model's context; bits per byte
(nats x tokens / bytes / ln 2) compares models with different tokenizers. Speed and heap come from
`python -m rp2040.emulate` (int8 export, real RPI_PICO firmware, emulated cycles at 125 MHz); the
sample is the device runtime's own text on the host (`rp2040.run`, the same ids as the board).
"""
from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from configs.presets import MODEL_PRESETS, TRAIN_PRESETS, preset_list  # noqa: E402
from utils.data.prepare import prepare  # noqa: E402
from utils.ckpt.format import MARKER  # noqa: E402
from utils.ckpt.read import open_checkpoint  # noqa: E402
from utils.data.shards import open_shard, read_manifest  # noqa: E402
from utils.errors import CliParser, PiconeoxError, at_least, cli  # noqa: E402

TINYSTORIES = REPO.parent / "shared" / "data" / "tinystories"
PROMPT = "Once upon a time"


def dataset(preset: str, train: Path, val: Path, out: Path) -> Path:
    """TinyStories with the preset's tokenizer kind at the model's vocab (prepared once per tokenizer)."""
    kind = TRAIN_PRESETS[preset].tokenizer
    vocab = MODEL_PRESETS[preset].vocab_size if kind == "bpe" else None
    name = f"tinystories-{kind}{vocab or ''}"
    if not (out / name / "manifest.json").exists():
        prepare([str(train)], name, out, kind, vocab, val=[str(val)], workers=1)
    return out / name


@torch.no_grad()
def val_metrics(ckpt: Path, data: Path) -> tuple[float, float]:
    """(mean loss in nats per token, bits per byte) over the whole val split in blocks of the context."""
    model, tok = open_checkpoint(str(ckpt))
    model.eval()
    ids = np.concatenate([open_shard(data, s) for s in read_manifest(data).split_shards("val")]).astype(np.int64)
    ctx = model.config.max_position_embeddings
    n = (len(ids) - 1) // ctx
    x = torch.from_numpy(ids[: n * ctx]).view(n, ctx)
    y = torch.from_numpy(ids[1: n * ctx + 1]).view(n, ctx)
    nats = sum(F.cross_entropy(model(input_ids=x[i: i + 64]).logits.flatten(0, 1), y[i: i + 64].flatten(),
                               reduction="sum").item() for i in range(0, n, 64))
    text_bytes = len(tok.decode(y.flatten().tolist(), skip_special_tokens=True).encode("utf-8"))
    return nats / y.numel(), nats / text_bytes / math.log(2)


def emulated(model_dir: Path, tokens: int) -> tuple[str, str]:
    """(tok/s, heap free after load) from rp2040.emulate, or why there is none."""
    try:
        from rp2040.emulate import emulate, unavailable
    except ImportError:
        return "n/a (no rp2040.emulate)", ""
    if why := unavailable():
        return f"n/a ({why})", ""
    e = emulate(model_dir, PROMPT, tokens, progress=False)
    return f"{e.tok_per_s:.1f}", f"{e.heap_loaded:,}" + (" (streamed)" if e.stream else "")


@cli
def main(argv=None) -> int:
    ap = CliParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", type=preset_list,
                    default="rp2040-speed,rp2040-optimized,pico-fast,rp2040-quality,pico-best,pico-large")
    ap.add_argument("--out", type=Path, default=Path("/tmp/pico-tinystories"))
    ap.add_argument("--train", type=Path, default=TINYSTORIES / "tinystories_10k.txt")
    ap.add_argument("--val", type=Path, default=TINYSTORIES / "tinystories_val.txt")
    ap.add_argument("--tokens", type=at_least(1), default=16, help="tokens generated on the emulated Pico")
    args = ap.parse_args(argv)
    if not (args.train.is_file() and args.val.is_file()):
        raise PiconeoxError(f"{args.train} or {args.val} not found (see ../shared/data/PROVENANCE.md)")
    py, rows = sys.executable, []
    for preset in args.presets:
        data = dataset(preset, args.train, args.val, args.out / "data")
        run = args.out / "ckpt" / preset
        if not (run / "final" / MARKER).exists():
            subprocess.run([py, "train.py", "--config", preset, "--data", str(data), "--output-dir",
                            str(args.out / "ckpt"), "--log-dir", str(args.out / "logs"), "--run-name", preset],
                           cwd=REPO, check=True)
        model_dir = args.out / "models" / preset
        subprocess.run([py, "-m", "rp2040.export", str(run / "final"), "--out", str(model_dir), "--dtype", "int8"],
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        loss, bpb = val_metrics(run / "final", data)
        speed, heap = emulated(model_dir, args.tokens)
        sample = subprocess.run([py, "-m", "rp2040.run", str(model_dir), "--prompt", PROMPT, "--max-new-tokens", "48"],
                                cwd=REPO, check=True, capture_output=True, text=True).stdout
        params = sum(p.numel() for p in open_checkpoint(str(run / "final"))[0].parameters())
        sample = " ".join(re.sub(r"\[\d+ tokens.*\]\s*$", "", sample).split()).replace("|", "\\|")  # drop the rate line
        rows.append(f"| `{preset}` | {params:,} | {(model_dir / 'model.bin').stat().st_size:,} | {heap} | {speed} | "
                    f"{loss:.3f} | {math.exp(loss):.1f} | {bpb:.3f} | {sample} |")
        print(rows[-1], flush=True)
    print("\n| preset | params | model.bin (int8) | heap free after load | tok/s (emulated) | val loss | "
          "perplexity | bits/byte | sample |\n|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
