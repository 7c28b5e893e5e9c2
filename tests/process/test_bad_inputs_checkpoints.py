"""Bad input to the checkpoint CLIs (utils.generate, utils.evaluate, utils.consolidate): exit 2, one `error:` line
naming the value, no traceback, nothing written; each class of mistake through the one mechanism the class has
(utils.atomic for output paths, utils.devices, utils.textfile for text). The cases run in one interpreter
(tests/support/cli.py)."""
import shutil

import pytest

from tests.support.cli import assert_cli_table, binary_file
from tests.support.rp2040_models import exported_pico


@pytest.fixture(scope="module")
def pico_model(tmp_path_factory):
    """An exported Pico model: a folder that is not utils.consolidate's to replace."""
    return exported_pico(tmp_path_factory.mktemp("pico"))[1]


def test_checkpoint_clis_refuse_bad_values_with_one_line(tmp_path, pico_model):
    import torch

    png = binary_file(tmp_path / "loss.png")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("some notes\n")
    exported = tmp_path / "exported"
    shutil.copytree(pico_model, exported)
    (tmp_path / "runs" / "r" / "best").mkdir(parents=True)  # a checkpoints root
    txt = str(a_file)
    assert_cli_table([
        # sampling settings are checked before the checkpoint is even opened
        ("utils.generate", [], "the following arguments are required: checkpoint"),
        ("utils.generate", ["missing", "--temperature", "nan"], "--temperature nan: must be a number >= 0"),
        ("utils.generate", ["missing", "--temperature", "-1"], "--temperature -1.0: must be a number >= 0"),
        ("utils.generate", ["missing", "--top-k", "-5"], "--top-k -5: must be an integer >= 0"),
        ("utils.generate", ["missing", "--max-new-tokens", "0"], "--max-new-tokens 0: must be a positive integer"),
        ("utils.generate", ["missing", "--seed", str(2**64)], "must be an integer from 0 to 2**63 - 1"),
        # output paths: checked before any work, never over someone else's folder
        ("utils.evaluate", ["missing", "--eval-perplexity", txt, "--output", str(a_file / "r.json")],
         f"--output {a_file / 'r.json'}: {a_file} is a file, not a folder"),
        ("utils.evaluate", ["missing", "--eval-perplexity", txt, "--output", str(tmp_path)],
         "is a folder: give a file"),
        ("utils.consolidate", [str(tmp_path), "--out", str(exported)], "not a consolidated checkpoint"),
        ("utils.consolidate", [str(tmp_path), "--out", str(a_file / "sub")], "is a file, not a folder"),
        # devices
        ("utils.evaluate", ["missing", "--eval-perplexity", txt, "--device", "tpu"], "--device 'tpu' is not allowed"),
        *([] if torch.cuda.is_available() else
          [("utils.evaluate", ["missing", "--eval-perplexity", txt, "--device", "cuda"], "no CUDA GPU")]),
        # binary input: the one text reader
        ("utils.evaluate", ["missing", "--eval-perplexity", png], f"--eval-perplexity {png}: not UTF-8 at byte 0"),
        ("utils.evaluate", ["missing", "--eval-perplexity", str(tmp_path)], "is a folder, not a text file"),
        # no silent success, and per-flag messages
        ("utils.evaluate", ["missing", "--tasks", ","], "--tasks ',' names no task"),
        ("utils.evaluate", ["missing", "--tasks", "x", "--batch-size", "0"], "--batch-size '0': must be a positive"),
        ("utils.evaluate", ["missing", "--tasks", "x", "--limit", "0"], "--limit 0: must be a positive integer"),
        ("utils.evaluate", ["missing", "--tasks", "x", "--num-fewshot", "-1"], "--num-fewshot -1: must be an integer"),
        # flag mistakes are one line, not argparse's usage block
        ("utils.evaluate", [str(pico_model), "--bogus"], "unrecognized arguments: --bogus"),
        ("utils.consolidate", [str(pico_model), "--out", str(tmp_path / "new"), "--bogus"],
         "unrecognized arguments: --bogus"),
        # folders told apart: a folder of runs, a file
        ("utils.generate", [str(tmp_path / "runs")], "is a folder of runs (r), not a checkpoint"),
        ("utils.evaluate", [str(tmp_path / "runs"), "--eval-perplexity", txt],
         "is a folder of runs (r), not a checkpoint"),
        ("utils.generate", [txt], "is a file, not a checkpoint folder"),
        ("utils.evaluate", [txt, "--eval-perplexity", txt], "is a file, not a checkpoint folder"),
    ], tmp_path)
