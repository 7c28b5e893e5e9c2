"""The tiny in-process training run that many tests start (use the fresh_accelerate_state fixture)."""
import contextlib
import json
import sys

TINY = ["--config", "test", "--set", "model.num_layers=1", "--set", "model.hidden_size=32", "--set",
        "model.num_heads=4", "--set", "model.intermediate_size=64", "--seq-len", "32", "--batch-size", "4",
        "--log-every", "1", "--warmup-steps", "2", "--lr", "3e-3"]

# The session's trained_long run (tests/conftest.py): a test that resumes it passes the same arguments.
LONG_RUN = ("--max-steps", "40", "--save-every", "10", "--keep-last", "4", "--eval-every", "10")
# run() samples no text at the end (--sample-tokens 0; 0.25 of a 2-step run's 0.42 CPU seconds): a test that reads
# the sample passes SAMPLE.
SAMPLE = ("--sample-tokens", "200")


def reset_accelerate_state() -> None:
    """Forget the Accelerator an in-process run built, so that the next run in this process builds its own.

    accelerate keeps one state per process (AcceleratorState with its PartialState, and GradientState) that a second
    Accelerator would reuse with the first one's settings. accelerate has no public reset: this is the one place the
    tests call its private `_reset_state`. Nothing to do when accelerate was never imported."""
    if "accelerate.state" not in sys.modules:
        return
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@contextlib.contextmanager
def one_torch_thread():
    """torch on one thread inside: the same numerics in every test, and no OpenMP thread spinning for a core that a
    busy box does not give it (a 6-step in-process run: 30 s on two threads beside other work, 1.7 s on one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run(tmp_path, data, *extra, name="run"):
    """Run train.py in-process (use the fresh_accelerate_state fixture) on one torch thread and without the
    end-of-run sample unless `extra` asks for it (SAMPLE); return (exit code, per-step train losses, run dir)."""
    import train

    with one_torch_thread():
        code = train.main([*TINY, "--data", str(data), "--output-dir", str(tmp_path / "ckpt"), "--log-dir",
                           str(tmp_path / "logs"), "--run-name", name, "--sample-tokens", "0", *extra])
    history = tmp_path / "logs" / name / "history.json"
    losses = []
    if history.exists():
        losses = [r["train/loss"] for r in json.loads(history.read_text()) if "train/loss" in r]
    return code, losses, tmp_path / "ckpt" / name
