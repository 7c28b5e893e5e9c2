"""What a finished run tells its user: a text sample, where its files are, and what to run next."""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path


def log_sample(model, tokenizer, prompt: str, tokens: int, seed: int, log, deadline: float | None = None,
               stop=None) -> str:
    """Every rank samples: under FSDP each forward all-gathers the shards, so rank 0 alone would hang.

    The same seed and the same gathered weights give every rank the same `tokens` forwards; rank 0 logs.
    `deadline` (time.monotonic()) or `stop()` (a Ctrl-C) ends the sample sooner: never under FSDP, where the ranks
    must agree.
    """
    from utils.lm import sample_text

    text = readable_sample(sample_text(model, tokenizer, prompt, max_new_tokens=tokens, temperature=0.8, top_k=40,
                                       seed=seed, deadline=deadline, stop=stop), tokenizer.eos_token)
    if stop is not None and stop():
        log.info("the sample was cut short by a stop signal; the run's checkpoints are saved")
    log.info("sample:\n" + text)
    return text


def readable_sample(text: str, eos: str | None, width: int = 100) -> str:
    """A sample as lines of at most `width` characters, each document on its own, `eos` on a line between them."""
    import textwrap

    parts = text.split(eos) if eos else [text]
    documents = ["\n".join(textwrap.fill(line, width) for line in part.strip().splitlines()) for part in parts]
    return f"\n{eos}\n".join(documents)


REPO = Path(__file__).resolve().parents[2]


def shown_path(path: Path) -> str:
    """`path` relative to the repository when it lies below it (the printed commands cd there first), else
    absolute. Not resolved: a .venv that is a symlink stays `.venv/bin/python`."""
    path = Path(os.path.abspath(path))
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def command(*words) -> str:
    """A command line that runs from any folder and any path: cd to the repository, every word quoted."""
    return f"cd {shlex.quote(str(REPO))} && {shlex.join(shown_path(w) if isinstance(w, Path) else w for w in words)}"


def where_things_are(run_dir: Path, log_dir: Path, log_root: str) -> str:
    """The closing line: checkpoints, logs, and the TensorBoard command for them."""
    tensorboard = command(Path(sys.executable).parent / "tensorboard", "--logdir", Path(log_root))
    return f"checkpoints in {run_dir}, logs in {log_dir} ({tensorboard})"


def next_commands(preset: str, run_dir: Path, stopped: bool, last: Path | None = None) -> str:
    """What a newcomer runs after training: continue, sample best/ (else final/, else `last`, the newest step when
    a run writes neither), and for Pico presets export."""
    py = Path(sys.executable)
    lines = ["next:"]
    if stopped:
        lines.append("  continue this run: the same command plus --resume auto")
    sampled = next((run_dir / name for name in ("best", "final") if (run_dir / name).is_dir()), last)
    if sampled is not None:  # a stop before the first evaluation has no best/ (nor final/ when its save failed)
        lines.append("  " + command(py, "-m", "utils.generate", Path(sampled), "--prompt", "Once upon a time",
                                    "--max-new-tokens", "200"))
    if preset.startswith(("rp2040", "pico")):
        lines.append("  " + command(py, "-m", "rp2040.export", Path(run_dir), "--out", f"models/{run_dir.name}",
                                    "--dtype", "int8") + "   # then rp2040.run / rp2040.flash")
    return "\n".join(lines)
