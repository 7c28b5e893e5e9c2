"""Bad input to the rp2040 CLIs (export, run, emulate, flash): exit 2, one `error:` line naming the value, no
traceback, nothing written; output paths through utils.atomic, firmware through rp2040.uf2, prompts through
rp2040.prompt (the host's limit, the same in both CLIs that take one). The cases run in one interpreter
(tests/support/cli.py)."""
import shutil

import pytest

from tests.support.cli import assert_cli_table
from tests.support.rp2040_models import exported_pico, uf2_block


@pytest.fixture(scope="module")
def pico(tmp_path_factory):
    """(checkpoint, exported int8 model) of the rp2040-speed preset: what the rp2040 CLIs take."""
    return exported_pico(tmp_path_factory.mktemp("pico"))


def test_rp2040_clis_refuse_bad_values_with_one_line(tmp_path, pico):
    ckpt, model = pico
    a_file = tmp_path / "notes.txt"
    a_file.write_text("some notes\n")
    other = tmp_path / "other"  # a folder of the user's own files
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    garbage = tmp_path / "garbage-config"
    shutil.copytree(model, garbage)
    (garbage / "config.json").write_text("{not json")
    (tmp_path / "family.uf2").write_bytes(uf2_block(0xADA52840))  # an nRF52840 image
    long_prompt = "a" * 20_000
    assert_cli_table([
        # output paths: checked before any work, never over someone else's folder
        ("rp2040.export", [str(ckpt), "--out", str(a_file / "sub")], "is a file, not a folder"),
        ("rp2040.export", [str(ckpt), "--out", "/proc/piconeox"], "cannot write in /proc"),
        ("rp2040.export", [str(ckpt), "--out", str(other)], "holds other files (keep.txt), not an exported model"),
        ("rp2040.export", [str(ckpt), "--out", str(tmp_path / "new"), "--ram-budget-kb", "1"],
         "KB a Pico has free; use a smaller model, --ram-budget-kb, or --force"),
        # a firmware that is not an RP2040 UF2
        ("rp2040.emulate", [str(model), "--firmware", str(a_file)], "is not a UF2 image"),
        ("rp2040.emulate", [str(model), "--firmware", str(tmp_path / "family.uf2")], "a UF2 image for another chip"),
        # flag mistakes are one line, not argparse's usage block
        *[(cli, [str(model), "--bogus"], "unrecognized arguments: --bogus")
          for cli in ("rp2040.run", "rp2040.emulate", "rp2040.flash")],
        ("rp2040.export", [str(model), "--out", str(tmp_path / "new"), "--bogus"], "unrecognized arguments: --bogus"),
        # the prompt limit on the host (both CLIs agree), and a config.json that is not JSON named
        *[(cli, [str(model), "--prompt", long_prompt], "prompt too long for the Pico's RAM: 20,000 characters, at most")
          for cli in ("rp2040.run", "rp2040.emulate")],
        *[(cli, [str(garbage)], f"{garbage / 'config.json'} is not valid JSON")
          for cli in ("rp2040.run", "rp2040.emulate")],
    ], tmp_path)
