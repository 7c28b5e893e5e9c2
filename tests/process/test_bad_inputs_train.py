"""Bad input to every CLI: exit 2, one `error:` line naming the value, no traceback, nothing damaged.

The Python CLIs run in ONE subprocess (a driver calls each `main(argv)` in turn, catching what escapes),
so a table of cases costs one interpreter start, not one each; the shell CLIs run as themselves.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.cli import assert_one_error_line, binary_file, run_cli_cases
from tests.support.paths import REPO
from tests.support.rp2040_models import uf2_block
from tests.support.training import TINY, reset_accelerate_state
from tests.support.waits import wait_for


def test_python_clis_refuse_bad_values_with_one_line(tmp_path, tiny_data):
    png = binary_file(tmp_path / "image.png")
    (tmp_path / "sections.yaml").write_text("model: 5\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    wrong_crc = tmp_path / "wrong-crc"
    shutil.copytree(tiny_data, wrong_crc)
    manifest = json.loads((wrong_crc / "manifest.json").read_text())
    manifest["shards"][0]["crc32c"] ^= 1
    (wrong_crc / "manifest.json").write_text(json.dumps(manifest))
    before = {p: p.is_file() and p.read_bytes() for p in tmp_path.rglob("*")}
    cases = [
        # a manifest crc32c that does not match the shard, before the launch and in the run itself
        ("train", ["--preflight", "--data", str(wrong_crc)], "has crc32c"),
        ("train", ["--data", str(wrong_crc), "--max-steps", "1"], "has crc32c"),
        # output folders that cannot be written (under a file; a place nobody may write, even root)
        ("prepare_data", ["--out-dir", str(a_file / "sub")], "is a file, not a folder"),
        ("prepare_data", ["--out-dir", "/proc/piconeox"], "cannot write in /proc"),
        ("train", ["--preflight", "--output-dir", str(a_file / "ckpt")], "is a file, not a folder"),
        ("train", ["--preflight", "--log-dir", "/proc/piconeox"], "cannot write in /proc"),
        ("train", ["--data", str(tiny_data), "--log-dir", str(a_file), "--max-steps", "1"], "is a file, not a folder"),
        ("download_training_data", ["--source", str(tiny_data), "--dest", str(a_file / "x")],
         "is a file, not a folder"),
        ("download_training_data", ["--push", str(tiny_data), "--dest", "/proc/piconeox"], "cannot write in /proc"),
        ("train", ["--preflight", "--run-name", "../elsewhere"], "--run-name '../elsewhere' is not allowed"),
        # the sweep past the list: flag mistakes are one line too (not argparse's usage block), a text file as
        # --data says how to prepare it, a tokenizer vocab the tokenizer cannot have
        ("train", ["--preflight", "--bogus"], "unrecognized arguments: --bogus"),
        ("prepare_data", ["--tokenizer", "words"], "invalid choice: 'words'"),
        ("download_training_data", ["--dest", "x"], "one of the arguments --source --push is required"),
        ("utils.generate", [], "the following arguments are required: checkpoint"),
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
        # sampling settings are checked before the checkpoint is even opened
        ("utils.generate", ["missing", "--temperature", "nan"], "--temperature nan: must be a number >= 0"),
        ("utils.generate", ["missing", "--temperature", "-1"], "--temperature -1.0: must be a number >= 0"),
        ("utils.generate", ["missing", "--top-k", "-5"], "--top-k -5: must be an integer >= 0"),
        ("utils.generate", ["missing", "--max-new-tokens", "0"], "--max-new-tokens 0: must be a positive integer"),
        ("utils.generate", ["missing", "--seed", str(2**64)], "must be an integer from 0 to 2**63 - 1"),
        ("train", ["--preflight", "--seed", str(2**32)], f"train.seed={2**32}: must be below 2**32"),
        # the Pico shape search checks every shape before it trains any
        ("benchmarks.pico_search", ["--shapes", "h24-l3-a4-f96-c64", "h20-4"], "shape 'h20-4' is not hidden-layers"),
        ("benchmarks.pico_search", ["--shapes", "h20-l4-a4-f80-c64"], "head_dim 5 gives 5 rotary dims"),
        ("benchmarks.bench_math", ["--presets", "pico-best,production"], "'production' is not a CPU-sized preset"),
        ("benchmarks.bench_math", ["--steps", "0"], "--steps: 0 must be at least 1"),
        ("train", ["--preflight", "--set", "train.attention=flash"], "train.attention='flash': allowed sdpa, eager"),
    ]
    results = run_cli_cases([(m, argv) for m, argv, _ in cases], tmp_path)
    for (module, argv, message), (code, err) in zip(cases, results):
        assert_one_error_line(code, err, message, f"{module} {' '.join(argv)}")
    assert {p: p.is_file() and p.read_bytes() for p in tmp_path.rglob("*")} == before  # nothing written or changed


@pytest.fixture(scope="module")
def pico(tmp_path_factory):
    """(checkpoint, exported int8 model) of the rp2040-speed preset: what the rp2040 CLIs take."""
    from rp2040.export import export
    from tests.support.rp2040_models import save_checkpoint

    d = tmp_path_factory.mktemp("pico")
    ckpt = save_checkpoint("rp2040-speed", d / "ckpt")[0]
    export(ckpt, d / "model", "int8")
    return ckpt, d / "model"


def test_each_class_of_mistake_is_one_line_in_every_cli(tmp_path, tmp_path_factory, tiny_data, pico):
    """Each class of mistake (output paths, devices, binary input, silent successes, firmware, flags, prompts), in
    every CLI of that class, through the one mechanism the class has (utils.atomic, utils.devices, utils.textfile,
    rp2040.uf2, rp2040.prompt)."""
    import torch

    ckpt, model = pico
    png = binary_file(tmp_path / "loss.png")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("some notes\n")
    exported = tmp_path / "exported"  # an exported Pico model: not utils.consolidate's to replace
    shutil.copytree(model, exported)
    other = tmp_path / "other"  # a folder of the user's own files
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    (tmp_path / "runs" / "r" / "best").mkdir(parents=True)  # a checkpoints root
    garbage = tmp_path / "garbage-config"
    shutil.copytree(model, garbage)
    (garbage / "config.json").write_text("{not json")
    (tmp_path / "family.uf2").write_bytes(uf2_block(0xADA52840))  # an nRF52840 image
    long_prompt = "a" * 20_000
    wrong_crc = tmp_path / "wrong-crc"
    shutil.copytree(tiny_data, wrong_crc)
    manifest = json.loads((wrong_crc / "manifest.json").read_text())
    manifest["shards"][0]["crc32c"] ^= 1
    (wrong_crc / "manifest.json").write_text(json.dumps(manifest))
    download_dest = tmp_path_factory.mktemp("download") / "copy"  # written (a faithful copy), outside the check
    txt = str(a_file)
    before = {p: p.is_file() and p.read_bytes() for p in tmp_path.rglob("*")}
    cases = [
        # 1. output paths: checked before any work, never over someone else's folder
        ("rp2040.export", [str(ckpt), "--out", str(a_file / "sub")], "is a file, not a folder"),
        ("rp2040.export", [str(ckpt), "--out", "/proc/piconeox"], "cannot write in /proc"),
        ("rp2040.export", [str(ckpt), "--out", str(other)], "holds other files (keep.txt), not an exported model"),
        ("utils.evaluate", ["missing", "--eval-perplexity", txt, "--output", str(a_file / "r.json")],
         f"--output {a_file / 'r.json'}: {a_file} is a file, not a folder"),
        ("utils.evaluate", ["missing", "--eval-perplexity", txt, "--output", str(tmp_path)],
         "is a folder: give a file"),
        ("utils.consolidate", [str(tmp_path), "--out", str(exported)], "not a consolidated checkpoint"),
        ("utils.consolidate", [str(tmp_path), "--out", str(a_file / "sub")], "is a file, not a folder"),
        # 2. devices
        ("utils.evaluate", ["missing", "--eval-perplexity", txt, "--device", "tpu"], "--device 'tpu' is not allowed"),
        *([] if torch.cuda.is_available() else
          [("utils.evaluate", ["missing", "--eval-perplexity", txt, "--device", "cuda"], "no CUDA GPU")]),
        # 3. binary input: the one text reader
        ("utils.evaluate", ["missing", "--eval-perplexity", png], f"--eval-perplexity {png}: not UTF-8 at byte 0"),
        ("utils.evaluate", ["missing", "--eval-perplexity", str(tmp_path)], "is a folder, not a text file"),
        # 4. silent successes
        ("download_training_data", ["--source", str(wrong_crc), "--dest", str(download_dest), "--quiet"],
         "the downloaded dataset does not match its manifest"),
        ("utils.evaluate", ["missing", "--tasks", ","], "--tasks ',' names no task"),
        # 5. a firmware that is not an RP2040 UF2
        ("rp2040.emulate", [str(model), "--firmware", txt], "is not a UF2 image"),
        ("rp2040.emulate", [str(model), "--firmware", str(tmp_path / "family.uf2")], "a UF2 image for another chip"),
        # 14. flag mistakes are one line in every CLI
        *[(cli, [str(model), "--bogus"], "unrecognized arguments: --bogus")
          for cli in ("rp2040.run", "rp2040.emulate", "rp2040.flash", "utils.evaluate")],
        *[(cli, [str(model), "--out", str(tmp_path / "new"), "--bogus"], "unrecognized arguments: --bogus")
          for cli in ("rp2040.export", "utils.consolidate")],
        # the prompt limit on the host (both CLIs agree), per-flag messages, files named,
        # folders told apart
        *[(cli, [str(model), "--prompt", long_prompt], "prompt too long for the Pico's RAM: 20,000 characters, at most")
          for cli in ("rp2040.run", "rp2040.emulate")],
        ("utils.evaluate", ["missing", "--tasks", "x", "--batch-size", "0"], "--batch-size '0': must be a positive"),
        ("utils.evaluate", ["missing", "--tasks", "x", "--limit", "0"], "--limit 0: must be a positive integer"),
        ("utils.evaluate", ["missing", "--tasks", "x", "--num-fewshot", "-1"], "--num-fewshot -1: must be an integer"),
        *[(cli, [str(garbage)], f"{garbage / 'config.json'} is not valid JSON")
          for cli in ("rp2040.run", "rp2040.emulate")],
        ("utils.generate", [str(tmp_path / "runs")], "is a folder of runs (r), not a checkpoint"),
        ("utils.evaluate", [str(tmp_path / "runs"), "--eval-perplexity", txt],
         "is a folder of runs (r), not a checkpoint"),
        ("utils.generate", [txt], "is a file, not a checkpoint folder"),
        ("utils.evaluate", [txt, "--eval-perplexity", txt], "is a file, not a checkpoint folder"),
        ("rp2040.export", [str(ckpt), "--out", str(tmp_path / "new"), "--ram-budget-kb", "1"],
         "KB a Pico has free; use a smaller model, --ram-budget-kb, or --force"),
    ]
    results = run_cli_cases([(m, argv) for m, argv, _ in cases], tmp_path)
    failed = []
    for (module, argv, message), (code, err) in zip(cases, results):
        try:
            assert_one_error_line(code, err, message, f"{module} {' '.join(argv)[:200]}")
            if "--bogus" in argv:  # the one line only, not argparse's usage block above it
                assert len(err.strip().splitlines()) == 1, f"{module} --bogus:\n{err}"
        except AssertionError as e:
            failed.append(str(e))
    assert not failed, "\n\n".join(failed)
    assert {p: p.is_file() and p.read_bytes() for p in tmp_path.rglob("*")} == before  # nothing written or changed


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


@pytest.mark.parametrize("tokenizer,extra,copies,busy_when,delay", [
    # inside the BPE training (Rust, fed from its own thread): Ctrl-C used to wait until all text was read
    ("bpe", ["--vocab-size", "300", "--retrain-tokenizer"], 40, "read for tokenizer:", 3.0),
    ("byte", ["--workers", "2"], 40, "tokenize d:", 1.0),  # while the worker pool tokenizes
])
def test_ctrl_c_during_prepare_stops_at_once_and_keeps_the_old_dataset(tmp_path, shared_data, tokenizer, extra,
                                                                       copies, busy_when, delay):
    from utils.data.prepare import prepare

    old = prepare(["demo"], "d", tmp_path / "data", tokenizer, 300 if tokenizer == "bpe" else None, dataset_percent=5)
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    src = tmp_path / "src"
    src.mkdir()
    for i in range(copies):  # 1.4 MB of real stories each: many seconds of work that Ctrl-C must cut short
        (src / f"part{i:02d}.txt").symlink_to(shared_data / "tinystories" / "tinystories_10k.txt")
    proc = subprocess.Popen([sys.executable, str(REPO / "prepare_data.py"), str(src), "--name", "d", "--out-dir",
                             str(tmp_path / "data"), "--tokenizer", tokenizer, *extra], cwd=tmp_path,
                            # as users run it
                            env={k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    err = bytearray()

    def read_stderr():
        while chunk := os.read(proc.stderr.fileno(), 4096):
            err.extend(chunk)

    reader = threading.Thread(target=read_stderr)
    reader.start()
    wait_for(f"prepare_data.py to print {busy_when!r}", lambda: busy_when.encode() in err or proc.poll() is not None,
             timeout=bound(240))
    time.sleep(delay)  # deeper into the work: any moment of it is a fair place for a Ctrl-C
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole process group
    try:  # a hang bound; that the Ctrl-C ended it, not the end of the work, shows in the old dataset kept below
        proc.wait(timeout=bound(60))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("prepare_data.py still running 120 s after Ctrl-C")
    reader.join()
    text = err.decode()
    assert proc.returncode == 130 and "Traceback" not in text, text[-2000:]
    assert text.strip().endswith(f"error: interrupted; {old} is as it was before")
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before  # no .staging, nothing changed


def test_ctrl_c_ends_a_cli_at_once_beside_native_work_it_cannot_stop(tmp_path):
    """BPE training runs in Rust on a thread that Ctrl-C cannot stop: Python's shutdown would wait for such a thread,
    or end it from inside Rust, which aborted prepare_data.py (exit -6, "FATAL: exception not rethrown") in 1 of 15
    interrupted runs on a loaded box. A CLI that leaves one running ends without that shutdown."""
    script = tmp_path / "interrupted.py"
    script.write_text("import sys, threading, time\n"
                      "from utils.errors import cli, leave_running\n"
                      "@cli\n"
                      "def main(argv=None):\n"
                      "    work = threading.Thread(target=time.sleep, args=(600,))  # not a daemon: shutdown waits\n"
                      "    work.start()\n"
                      "    leave_running(work)\n"
                      "    print('output so far', end='')  # still flushed\n"
                      "    raise KeyboardInterrupt\n"
                      "sys.exit(main())\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=bound(120),
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "output so far", "error: interrupted\n")


@pytest.mark.parametrize("script,args,message", [
    ("start_training.sh", ["--config", "test", "--gpus", "99999999999999999999"],
     "--gpus '99999999999999999999' is not a whole number"),
    ("start_training.sh", ["--config", "test", "--gpus", "0", "--", "--bogus"], "unrecognized arguments: --bogus"),
    ("start_training.sh", ["--config", "test", "--gpus", "0", "--", "--set", "train.beta2=5"], "train.beta2=5.0"),
    ("setup.sh", ["--bogus"], "unknown option '--bogus'"),
    ("benchmarks/shakespeare_char.sh", ["--presets"], "--presets needs a comma-separated list of presets"),
    ("benchmarks/shakespeare_char.sh", ["--fast"],
     "unknown argument --fast (allowed: --vs-nanogpt PATH, --presets LIST)"),
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


def fake_service_account_key(path, token_uri):
    """A well-formed service-account key whose token endpoint is a closed local port (no traffic leaves the box)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    path.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "1",
                                "private_key": pem.decode(), "client_email": "t@p.iam.gserviceaccount.com",
                                "client_id": "1", "token_uri": token_uri}))
    path.chmod(0o600)
    return str(path)


def closed_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files_below(*roots):
    return {p: p.read_bytes() for root in roots for p in sorted(Path(root).rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_data):
    """A 2-step run `r` (step-00000002, best, final) and the flags every refusal below shares. Trained once: each
    test below asserts that its refusals leave these files byte for byte as they were."""
    import train

    root = tmp_path_factory.mktemp("finished")
    ckpt, logs = root / "ckpt", root / "logs"
    common = [*TINY[2:], "--output-dir", str(ckpt), "--log-dir", str(logs), "--grace-seconds", "1"]
    try:
        assert train.main([*TINY, *common, "--data", str(tiny_data), "--run-name", "r", "--max-steps", "2",
                           "--eval-every", "2", "--save-every", "2"]) == 0
    finally:
        reset_accelerate_state()
    return ckpt, logs, common


def assert_nothing_left(ckpt, logs, before, context):
    """The earlier run's files byte for byte as before, and no folder of the refused name."""
    assert files_below(ckpt, logs) == before, f"{context}: files changed"
    assert [p.name for p in ckpt.iterdir()] == ["r"] and [p.name for p in logs.iterdir()] == ["r"], context


def test_refusals_after_the_checks_exit_2_and_take_back_what_they_created(tmp_path, tiny_data, char_data,
                                                                         finished_run, capsys, monkeypatch):
    """The 11 refusals that used to exit 1 (and leave checkpoints/<run>/ and a training.log
    that then blocked the corrected command). Here in-process; the launcher passes each on as exit 2 (next test)."""
    import train

    ckpt, logs, common = finished_run
    step, final = ckpt / "r" / "step-00000002", ckpt / "r" / "final"
    corrupt_final, corrupt_step = tmp_path / "corrupt-final", tmp_path / "corrupt-step"
    shutil.copytree(final, corrupt_final)
    shutil.copytree(step, corrupt_step)
    for folder in (corrupt_final, corrupt_step):
        for weights in [*folder.glob("*.safetensors"), *folder.glob("*.distcp")]:
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    shutil.copy(final / "config.json", corrupt_step)  # it looks like a Hugging Face folder until its weights load
    shutil.copy(final / "tokenizer.json", corrupt_step)
    key = fake_service_account_key(tmp_path / "key.json", f"http://127.0.0.1:{closed_port()}/token")
    resume = ["--data", str(tiny_data), "--resume", str(ckpt / "r")]
    new = ["--data", str(tiny_data), "--run-name", "new", "--max-steps", "2"]
    cases = [  # (train.py flags, environment, expected text)
        ([*resume, "--set", "model.hidden_size=64", "--max-steps", "4"], {},
         "checkpoint has model.hidden_size=32, this run has 64"),
        ([*resume, "--max-steps", "2"], {}, "the resumed run is already at step 2; raise --max-steps"),
        (["--data", str(char_data), "--resume", str(step), "--max-steps", "4"], {},
         "checkpoint has model.vocab_size=256"),
        ([*new, "--init-from", str(corrupt_final)], {}, f"{corrupt_final} is damaged"),
        ([*new, "--init-from", str(corrupt_step)], {}, f"{corrupt_step}"),
        ([*new, "--resume", "gs://piconeox-x/ckpt/r", "--credentials", key], {"STORAGE_EMULATOR_HOST": None},
         "--resume gs://piconeox-x/ckpt/r"),
        ([*new, "--resume", "gs://piconeox-x/ckpt/r"], {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{closed_port()}"},
         "--resume gs://piconeox-x/ckpt/r: list gs://piconeox-x/ckpt/r/"),
        ([*new, "--set", "train.global_batch_tokens=100"], {}, "train.global_batch_tokens=100 is not a whole multiple"),
        ([*new, "--set", "train.global_batch_tokens=256", "--grad-accum", "3"], {},
         "train.grad_accum_steps=3 disagrees"),
        (["--data", str(tiny_data), "--run-name", "r", "--max-steps", "4"], {},
         "holds an earlier run (best, final, step-00000002)"),
    ]  # the 11th, --report-to wandb without a login, is in test_trackers.py (W&B reads its settings once per process)
    before = files_below(ckpt, logs)
    for argv, env, message in cases:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.delenv(k, raising=False) if v is None else m.setenv(k, v)
            code = train.main([*TINY[:2], *common, *argv])
        reset_accelerate_state()
        assert_one_error_line(code, capsys.readouterr().err, message, " ".join(argv))
        assert_nothing_left(ckpt, logs, before, " ".join(argv))


@pytest.mark.parametrize("procs", [1, 2])
def test_the_launcher_exits_2_with_the_workers_one_line(tmp_path, tiny_data, finished_run, procs):
    """A refusal found only after `accelerate launch`, on 1 and on 2 processes: exit 2,
    the worker's one `error:` line once, no accelerate/torchrun traceback; and a global batch that does not divide
    over --procs is caught before the launch."""
    ckpt, logs, common = finished_run
    before = files_below(ckpt, logs)
    env = {**os.environ, "PICONEOX_FAKE_GPUS": "0", "OMP_NUM_THREADS": "1"}
    for argv, message in ((["--data", str(tiny_data), "--resume", str(ckpt / "r"), "--max-steps", "2", "--batch-size",
                            str(4 // procs)],  # the checkpoint's 128 tokens per step on `procs` processes
                           "the resumed run is already at step 2"),
                          (["--data", str(tiny_data), "--run-name", "new",
                            "--set", f"train.global_batch_tokens={128 * 3}"],
                           "is not a whole multiple")):
        if procs == 1 and "new" in argv:
            continue  # 3 micro batches divide over one process
        proc = subprocess.run(["bash", str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs",
                               str(procs), "--", *common, *argv], cwd=tmp_path, capture_output=True, text=True,
                              timeout=bound(300), env=env)
        assert_one_error_line(proc.returncode, proc.stderr, message, f"--procs {procs} {' '.join(argv)}")
        assert "ChildFailedError" not in proc.stderr and "CalledProcessError" not in proc.stderr, proc.stderr
        assert_nothing_left(ckpt, logs, before, " ".join(argv))


def test_an_earlier_run_is_a_run_record_and_a_refusal_takes_back_only_its_own_files(tmp_path):
    """A leftover training.log or a note is no run; a record is named; release() removes what this
    attempt added and its lines in an earlier log, never an earlier file."""
    from utils.errors import PiconeoxError
    from utils.run.run_folders import RunClaim, check_new_run, run_records

    run_dir, log_dir = tmp_path / "ckpt" / "r", tmp_path / "logs" / "r"
    log_dir.mkdir(parents=True)
    (log_dir / "training.log").write_text("a refused attempt of an older version\n")
    (log_dir / "notes.txt").write_text("mine")
    check_new_run(None, run_dir, log_dir)  # not an earlier run
    (log_dir / "events.out.tfevents.1.host").write_bytes(b"x")
    (run_dir / "best").mkdir(parents=True)
    assert run_records(run_dir) == ["best"] and run_records(log_dir) == ["events.out.tfevents.1.host"]
    with pytest.raises(PiconeoxError, match=r"ckpt/r holds an earlier run \(best\): pass --resume auto"):
        check_new_run(None, run_dir, log_dir)
    check_new_run("auto", run_dir, log_dir)

    before = files_below(tmp_path)
    claim = RunClaim(run_dir, log_dir, tmp_path / "other" / "new")
    claim.make()
    with open(log_dir / "training.log", "a") as f:
        f.write("this attempt's lines\n")
    (run_dir / "step-00000002").mkdir()
    (tmp_path / "other" / "new" / "events.out.tfevents.2.host").write_bytes(b"y")
    claim.release()
    assert files_below(tmp_path) == before and not (tmp_path / "other").exists() and (run_dir / "best").is_dir()
    claim = RunClaim(log_dir)
    claim.make()
    (log_dir / "history.json").write_text("[]")
    claim.accept()
    claim.release()  # accepted: the run's files stay
    assert (log_dir / "history.json").exists()
