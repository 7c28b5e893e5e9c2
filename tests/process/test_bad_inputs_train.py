"""Bad input to train.py, the launcher and the benchmarks that train: exit 2, one `error:` line naming the value, no
traceback, nothing damaged. The Python CLIs' cases run in ONE subprocess (tests/support/cli.py: a driver calls each
`main(argv)` in turn), so a table costs one interpreter start, not one each; the shell CLIs run as themselves.
The other families: test_bad_inputs_data.py, test_bad_inputs_checkpoints.py, test_bad_inputs_rp2040.py; a refusal
after the checks, which takes back what the run created: test_refused_runs.py.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.cli import assert_cli_table, assert_one_error_line, binary_file, wrong_crc_copy
from tests.support.paths import REPO
from tests.support.training import TINY


def test_train_and_benchmark_clis_refuse_bad_values_with_one_line(tmp_path, tiny_data):
    png = binary_file(tmp_path / "image.png")
    (tmp_path / "sections.yaml").write_text("model: 5\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    wrong_crc = wrong_crc_copy(tiny_data, tmp_path / "wrong-crc")
    assert_cli_table([
        # a manifest crc32c that does not match the shard, before the launch and in the run itself
        ("train", ["--preflight", "--data", str(wrong_crc)], "has crc32c"),
        ("train", ["--data", str(wrong_crc), "--max-steps", "1"], "has crc32c"),
        # output folders that cannot be written (under a file; a place nobody may write, even root)
        ("train", ["--preflight", "--output-dir", str(a_file / "ckpt")], "is a file, not a folder"),
        ("train", ["--preflight", "--log-dir", "/proc/piconeox"], "cannot write in /proc"),
        ("train", ["--data", str(tiny_data), "--log-dir", str(a_file), "--max-steps", "1"], "is a file, not a folder"),
        ("train", ["--preflight", "--run-name", "../elsewhere"], "--run-name '../elsewhere' is not allowed"),
        # flag mistakes are one line too (not argparse's usage block), a text file as --data says how to prepare
        # it, a tokenizer vocab the tokenizer cannot have
        ("train", ["--preflight", "--bogus"], "unrecognized arguments: --bogus"),
        ("train", ["--preflight", "--data", str(a_file)], "is a file; prepare it first with `python prepare_data.py"),
        ("train", ["--preflight", "--set", "train.tokenizer_vocab=5"],
         "train.tokenizer_vocab=5: only for tokenizer bpe"),
        ("train", ["--preflight", "--config", "small", "--set", "train.tokenizer_vocab=5"],
         "must be an integer >= 257"),
        # settings
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
        ("train", ["--preflight", "--seed", str(2**32)], f"train.seed={2**32}: must be below 2**32"),
        ("train", ["--preflight", "--set", "train.attention=flash"], "train.attention='flash': allowed sdpa, eager"),
        # the Pico shape search checks every shape before it trains any
        ("benchmarks.pico_search", ["--shapes", "h24-l3-a4-f96-c64", "h20-4"], "shape 'h20-4' is not hidden-layers"),
        ("benchmarks.pico_search", ["--shapes", "h20-l4-a4-f80-c64"], "head_dim 5 gives 5 rotary dims"),
        ("benchmarks.bench_math", ["--presets", "pico-best,production"], "'production' is not a CPU-sized preset"),
        ("benchmarks.bench_math", ["--steps", "0"], "--steps: 0 must be at least 1"),
    ], tmp_path)


@pytest.mark.parametrize("eval_batches", ["0", "x"])
def test_eval_batches_flag_reaches_the_config(eval_batches):
    from configs import flags
    from configs.presets import resolve_config
    from utils.errors import PiconeoxError

    args = flags.parse_args(["--eval-batches", "7"])
    assert resolve_config("test", None, flags.overrides_from_args(args)).train.eval_batches == 7
    with pytest.raises(PiconeoxError, match="train.eval_batches"):
        resolve_config("test", None, flags.overrides_from_args(flags.parse_args(["--eval-batches", eval_batches])))


def test_a_run_folder_is_never_overwritten_and_the_end_says_what_next(tmp_path, tiny_data, char_data, capsys,
                                                                     fresh_accelerate_state):
    """On one tiny run (char tokenizer): refusal instead of a silent overwrite of best/, the eval
    line's interval throughput, the venv's tensorboard and the next commands; utils.generate refuses data of
    another tokenizer and prompt characters the char tokenizer would drop."""
    import re

    import train
    from utils import generate

    data = char_data
    argv = [*TINY, "--data", str(data), "--output-dir", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "logs"),
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

    best = tmp_path / "ckpt" / "r" / "best"
    before = {p.name: p.read_bytes() for p in best.iterdir()}
    capsys.readouterr()
    for flags in (["--preflight"], []):  # the launcher's check, and train.py run directly
        assert train.main(argv + flags) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "--resume auto" in err and "--run-name" in err
        assert len(err.splitlines()) == 1
    assert {p.name: p.read_bytes() for p in best.iterdir()} == before

    assert generate.main([str(best), "--eval-data", str(tiny_data), "--eval-batches", "1"]) == 2
    assert "was tokenized with another tokenizer than the checkpoint's" in capsys.readouterr().err
    assert generate.main([str(best), "--eval-data", str(data), "--eval-batches", "1", "--batch-size", "1"]) == 0
    assert "perplexity" in capsys.readouterr().out
    assert generate.main([str(best), "--prompt", "Once upon a time \u2603", "--max-new-tokens", "2"]) == 2
    assert "has characters this checkpoint's tokenizer does not know ('\u2603')" in capsys.readouterr().err


@pytest.mark.parametrize("script,args,message", [
    ("start_training.sh", ["--config", "test", "--gpus", "99999999999999999999"],
     "--gpus '99999999999999999999' is not a whole number"),
    ("start_training.sh", ["--config", "test", "--gpus", "0", "--", "--bogus"], "unrecognized arguments: --bogus"),
    ("start_training.sh", ["--config", "test", "--gpus", "0", "--", "--set", "train.beta2=5"], "train.beta2=5.0"),
    ("setup.sh", ["--bogus"], "unknown option '--bogus'"),
    ("benchmarks/shakespeare_char.sh", ["--presets"], "--presets needs a comma-separated list of presets"),
    ("benchmarks/shakespeare_char.sh", ["--fast"],
     "unknown argument --fast (allowed: --vs-nanogpt PATH, --presets LIST, --budget-ratios LIST, "
     "--budget-preset NAME)"),
    ("benchmarks/first_command.sh", ["--baseline"], "--baseline needs a git revision"),
    ("benchmarks/first_command.sh", ["--baseline", "no-such-rev"], "--baseline no-such-rev is not a commit"),
    ("benchmarks/first_command.sh", ["--fast"], "unknown argument --fast (allowed: --baseline REV, --config PRESET)"),
])
def test_shell_clis_refuse_bad_values_with_one_line(tmp_path, script, args, message):
    proc = subprocess.run(["bash", str(REPO / script), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=bound(60),
                          env={**os.environ, "PICONEOX_FAKE_GPUS": "0"})
    assert_one_error_line(proc.returncode, proc.stderr, message, script)
    assert len(proc.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())
