"""Bad input to every CLI: exit 2, one `error:` line naming the value, no traceback, nothing damaged.

The Python CLIs run in ONE subprocess (a driver calls each `main(argv)` in turn, catching what escapes),
so a table of cases costs one interpreter start, not one each; the shell CLIs run as themselves.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

DRIVER = r"""
import contextlib, importlib, io, json, sys, traceback
results = []
for module, argv in json.load(sys.stdin):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = importlib.import_module(module).main(argv)
        except SystemExit as e:  # argparse
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = "raised"
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def run_cli_cases(cases, cwd):
    """[(module, argv)] -> [(exit code, stderr)], all in one interpreter started in `cwd`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(cases), cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_one_error_line(code, err, message, context=""):
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err, f"{context}: exit {code}\n{err}"
    assert len(lines) == 1 and message in lines[0], f"{context}: expected one error line with {message!r}\n{err}"


def binary_file(path):
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe\x00")
    return str(path)


def test_python_clis_refuse_bad_values_with_one_line(tmp_path):
    png = binary_file(tmp_path / "image.png")
    (tmp_path / "sections.yaml").write_text("model: 5\n")
    cases = [
        # item 10: settings
        ("train", ["--preflight", "--config-file", png], "is not a text (UTF-8 YAML) file"),
        ("train", ["--preflight", "--config-file", str(tmp_path)], "is not a file"),
        ("train", ["--preflight", "--config-file", str(tmp_path / "sections.yaml")], "each a mapping"),
        ("train", ["--preflight", "--set", "train.beta2=5"], "train.beta2=5.0: must be in [0, 1)"),
        ("train", ["--preflight", "--max-training-hours", "nan"], "train.max_training_hours=nan"),
        ("train", ["--preflight", "--set", "train.grad_clip=nan"], "train.grad_clip=nan"),
        ("train", ["--preflight", "--lr", "inf"], "train.learning_rate=inf"),
        ("train", ["--preflight", "--set", "train.weight_decay=-1"], "train.weight_decay=-1.0"),
        ("train", ["--preflight", "--set", "model.layer_norm_eps=0"], "model.layer_norm_eps=0.0"),
        ("train", ["--preflight", "--eval-batches", "0"], "train.eval_batches=0: must be a positive integer"),
        # item 8: sampling settings are checked before the checkpoint is even opened
        ("utils.generate", ["missing", "--temperature", "nan"], "--temperature nan: must be a number >= 0"),
        ("utils.generate", ["missing", "--temperature", "-1"], "--temperature -1.0: must be a number >= 0"),
        ("utils.generate", ["missing", "--top-k", "-5"], "--top-k -5: must be an integer >= 0"),
        ("utils.generate", ["missing", "--max-new-tokens", "0"], "--max-new-tokens 0: must be a positive integer"),
    ]
    results = run_cli_cases([(m, argv) for m, argv, _ in cases], tmp_path)
    for (module, argv, message), (code, err) in zip(cases, results):
        assert_one_error_line(code, err, message, f"{module} {' '.join(argv)}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.png", "sections.yaml"]  # nothing written


@pytest.mark.parametrize("eval_batches", ["0", "x"])
def test_eval_batches_flag_reaches_the_config(eval_batches):
    import train
    from configs.presets import resolve_config
    from utils.errors import PiconeoxError

    args = train.parse_args(["--eval-batches", "7"])
    assert resolve_config("test", None, train.overrides_from_args(args)).train.eval_batches == 7
    with pytest.raises(PiconeoxError, match="train.eval_batches"):
        resolve_config("test", None, train.overrides_from_args(train.parse_args(["--eval-batches", eval_batches])))


@pytest.fixture
def fresh_accelerate_state():
    """Each in-process run builds its own Accelerator."""
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_a_run_folder_is_never_overwritten_and_the_end_says_what_next(tmp_path, tiny_data, capsys, fresh_accelerate_state):
    """Items 1, 11 and 8 on one tiny run: refusal instead of a silent overwrite of best/, the eval line's
    interval throughput, the venv's tensorboard and the next commands, and evaluation with another tokenizer."""
    import re

    import train
    from prepare_data import prepare
    from tests.test_train import TINY
    from utils import generate

    argv = [*TINY, "--data", str(tiny_data), "--output-dir", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "logs"),
            "--run-name", "r", "--max-steps", "4", "--eval-every", "2", "--save-every", "4"]
    assert train.main(argv) == 0
    log = (tmp_path / "logs" / "r" / "training.log").read_text()
    assert f"{Path(sys.executable).parent / 'tensorboard'}" in log or ".venv/bin/tensorboard --logdir" in log
    assert "next:" in log and "-m utils.generate" in log and str(tmp_path / "ckpt" / "r" / "best") in log
    # eval line at step 4: tokens of steps 3-4 over their summed step times, not step 4's own rate
    history = json.loads((tmp_path / "logs" / "r" / "history.json").read_text())
    times = {h["step"]: h["train/step_time_s"] for h in history if "train/step_time_s" in h}
    tokens_per_step = 4 * 32
    shown = int(re.findall(r"step 4: .*?, ([\d,]+) tok/s", log)[0].replace(",", ""))
    assert abs(shown - 2 * tokens_per_step / (times[3] + times[4])) <= 1

    best = tmp_path / "ckpt" / "r" / "best" / "model.safetensors"
    before = best.read_bytes()
    capsys.readouterr()
    for flags in (["--preflight"], []):  # the launcher's check, and train.py run directly
        assert train.main(argv + flags) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "--resume auto" in err and "--run-name" in err and len(err.splitlines()) == 1
    assert best.read_bytes() == before
    assert train.main(argv[:-4] + ["--max-steps", "6", "--eval-every", "2", "--resume", "auto"]) == 0

    other = prepare(["demo"], name="demo-char-p5", out_dir=tmp_path / "data", tokenizer="char", dataset_percent=5)
    capsys.readouterr()
    assert generate.main([str(tmp_path / "ckpt" / "r" / "best"), "--eval-data", str(other), "--eval-batches", "1"]) == 2
    assert "was tokenized with another tokenizer than the checkpoint's" in capsys.readouterr().err
    assert generate.main([str(tmp_path / "ckpt" / "r" / "best"), "--eval-data", str(tiny_data), "--eval-batches", "1",
                          "--batch-size", "1"]) == 0
    assert "perplexity" in capsys.readouterr().out
