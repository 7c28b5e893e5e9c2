"""What a finished run tells its user: a text sample, where its files are, and what to run next."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def log_sample(model, tokenizer, prompt: str, seed: int, log) -> str:
    """Every rank samples: under FSDP each forward all-gathers the shards, so rank 0 alone would hang.

    The same seed and the same gathered weights give every rank the same 200 forwards; rank 0 logs.
    """
    from utils.lm import sample_text

    text = readable_sample(sample_text(model, tokenizer, prompt, max_new_tokens=200, temperature=0.8, top_k=40,
                                       seed=seed), tokenizer.eos_token)
    log.info("sample:\n" + text)
    return text


def readable_sample(text: str, eos: str | None, width: int = 100) -> str:
    """A sample as lines of at most `width` characters, each document on its own, `eos` on a line between them."""
    import textwrap

    parts = text.split(eos) if eos else [text]
    documents = ["\n".join(textwrap.fill(line, width) for line in part.strip().splitlines()) for part in parts]
    return f"\n{eos}\n".join(documents)


def shown_path(path: Path) -> str:
    """`path` relative to the current directory when it lies below it (shorter to copy), else absolute."""
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else str(path)


def where_things_are(run_dir: Path, log_dir: Path, log_root: str) -> str:
    """The closing line: checkpoints, logs, and the TensorBoard command for them."""
    tensorboard = shown_path(Path(sys.executable).parent / "tensorboard")
    return f"checkpoints in {run_dir}, logs in {log_dir} ({tensorboard} --logdir {log_root})"


def next_commands(preset: str, run_dir: Path, stopped: bool, last: Path | None = None) -> str:
    """What a newcomer runs after training: continue, sample best/ (else final/, else `last`, the newest step when
    a run writes neither), and for Pico presets export."""
    py = shown_path(Path(sys.executable))
    lines = ["next:"]
    if stopped:
        lines.append("  continue this run: the same command plus --resume auto")
    sampled = next((run_dir / name for name in ("best", "final") if (run_dir / name).is_dir()), last)
    if sampled is not None:  # a stop before the first evaluation has no best/ (nor final/ when its save failed)
        lines.append(f"  {py} -m utils.generate {sampled} --prompt \"Once upon a time\" --max-new-tokens 200")
    if preset.startswith(("rp2040", "pico")):
        lines.append(f"  {py} -m rp2040.export {run_dir} --out models/{run_dir.name} --dtype int8   "
                     "# then rp2040.run / rp2040.flash")
    return "\n".join(lines)
