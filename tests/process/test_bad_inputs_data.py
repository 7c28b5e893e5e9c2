"""Bad input to the data CLIs (prepare_data.py, download_training_data.py): exit 2, one `error:` line naming the
value, no traceback, nothing damaged (the cases in one interpreter: tests/support/cli.py); and a Ctrl-C that ends
them at once, keeping the dataset that was there."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.support.bounds import bound
from tests.support.cli import assert_cli_table, wrong_crc_copy
from tests.support.paths import REPO
from tests.support.waits import wait_for


def test_data_clis_refuse_bad_values_with_one_line(tmp_path, tmp_path_factory, tiny_data):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    wrong_crc = wrong_crc_copy(tiny_data, tmp_path / "wrong-crc")
    download_dest = tmp_path_factory.mktemp("download") / "copy"  # written (a faithful copy), outside the check
    assert_cli_table([
        # output folders that cannot be written (under a file; a place nobody may write, even root)
        ("prepare_data", ["--out-dir", str(a_file / "sub")], "is a file, not a folder"),
        ("prepare_data", ["--out-dir", "/proc/piconeox"], "cannot write in /proc"),
        ("download_training_data", ["--source", str(tiny_data), "--dest", str(a_file / "x")],
         "is a file, not a folder"),
        ("download_training_data", ["--push", str(tiny_data), "--dest", "/proc/piconeox"], "cannot write in /proc"),
        # flag mistakes are one line too, not argparse's usage block
        ("prepare_data", ["--tokenizer", "words"], "invalid choice: 'words'"),
        ("download_training_data", ["--dest", "x"], "one of the arguments --source --push is required"),
        # no silent success: a copy that does not match its manifest
        ("download_training_data", ["--source", str(wrong_crc), "--dest", str(download_dest), "--quiet"],
         "the downloaded dataset does not match its manifest"),
    ], tmp_path)


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
        pytest.fail(f"prepare_data.py still running {bound(60):g} s after Ctrl-C")
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
