"""Faults a run meets and careless use (issue 35): a full disk, Ctrl-C, odd lock files, printed commands.

The full-disk tests mount a small tmpfs (root only; they skip with the reason elsewhere).
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) -> a folder on a tmpfs of that size; unmounted afterwards."""
    mounted = []

    def mount(size: str) -> Path:
        folder = tmp_path / f"disk{len(mounted)}"
        folder.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"a full disk is simulated with a small tmpfs, and mounting one needs root here "
                        f"(mount said: {proc.stderr.strip() or proc.returncode})")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def one_error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_a_full_checkpoint_disk_ends_the_run_with_one_line_and_keeps_the_last_checkpoint(tmp_path, tiny_data,
                                                                                        small_disk):
    """Item 1: room for one checkpoint of the test preset (10.7 MB), not two: the second save fails, the run stops
    at once (it used to hang: DCP's error is a BaseException that killed the saver thread)."""
    ckpt = small_disk("14m")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "train.py", "--data", str(tiny_data), "--max-steps", "8",
                           "--save-every", "2", "--eval-every", "100", "--output-dir", str(ckpt), "--log-dir",
                           str(tmp_path / "logs")], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc)
    run_dir = ckpt / "test-demo-byte-p5"
    assert f"no space left in {run_dir}: checkpoint step-00000004" in line and "needs about 10.3 MB" in line
    assert (run_dir / "step-00000002" / "COMPLETE").is_file(), sorted(run_dir.iterdir())
    assert time.monotonic() - start < 90


def test_a_full_disk_under_logs_plot_and_prepared_data_is_one_line(tmp_path, small_disk):
    """Item 1: the loss plot, training.log and prepare_data.py on a full disk: one line naming the folder."""
    disk = small_disk("64k")
    (disk / "filler").write_bytes(b"x" * (64 * 1024 - 4096))
    code = f"""
import logging, sys
from utils.diskfull import DiskFull
from utils.report.metrics import MetricsWriter, setup_logging
for what, write in [("plot", lambda: MetricsWriter({str(disk)!r}, True, ()).plot({str(disk / 'loss.png')!r})),
                    ("log", lambda: setup_logging({str(disk / 'training.log')!r}, True).info("x" * 100_000))]:
    try:
        write()
        print(what, "wrote")
    except DiskFull as e:
        print(what, e)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in proc.stderr and "Logging error" not in proc.stderr, proc.stderr
    assert f"plot no space left in {disk}: the loss plot loss.png" in proc.stdout, proc.stdout
    assert f"log no space left in {disk}: training.log" in proc.stdout, proc.stdout
    (disk / "filler").unlink()
    (disk / "filler").write_bytes(b"x" * (64 * 1024 - 8192))
    proc = subprocess.run([sys.executable, "prepare_data.py", "demo", "--name", "d", "--out-dir", str(disk),
                           "--tokenizer", "byte", "--dataset-percent", "5"], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert f"no space left in {disk}: dataset d" in one_error_line(proc)
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "training.log"]  # nothing of the dataset


def test_an_interrupt_under_the_launcher_is_130_and_one_line(tmp_path):
    """Item 2: a worker's second Ctrl-C (KeyboardInterrupt inside `cli`) reaches utils/launch.py as 130 and one
    line; the launcher said "a training process failed with exit code 1" before."""
    worker = tmp_path / "worker.py"
    worker.write_text("import sys\nfrom utils.errors import cli\n\n@cli\ndef main(argv=None):\n"
                      "    raise KeyboardInterrupt\n\nsys.exit(main())\n")
    proc = subprocess.run([sys.executable, str(REPO / "utils" / "launch.py"), "--cpu", "--num_processes", "1",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(worker)],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130 and one_error_line(proc) == "error: interrupted", proc.stderr[-2000:]


def test_ctrl_c_stops_the_benchmark_script_instead_of_running_the_next_command(tmp_path):
    """Item 2: train.py stops cleanly on Ctrl-C and exits 0, so shakespeare_char.sh went on to score and to the next
    preset (or failed there, exit 1); now it exits 130 once the run has stopped."""
    text = tmp_path / "small.txt"
    text.write_text("ROMEO: a short play.\nJULIET: and its reply, again and again.\n" * 3000)
    proc = subprocess.Popen(["bash", str(REPO / "benchmarks" / "shakespeare_char.sh"), "--presets",
                             "shakespeare-char"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**ENV, "SHAKESPEARE_TEXT": str(text)})
    seen = []
    for line in proc.stdout:  # signal the whole group once the first run trains, as a terminal's Ctrl-C does
        seen.append(line)
        if "global batch" in line:
            os.killpg(proc.pid, 2)
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 130, "".join(seen) + rest
    assert "SIGINT received" in rest and "piconeox shakespeare-char:" not in rest, rest  # no scoring after it
    assert rest.strip().endswith("error: interrupted") and "Traceback" not in rest, rest
