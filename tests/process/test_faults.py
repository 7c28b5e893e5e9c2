"""Faults a run meets and careless use: a full disk, Ctrl-C, odd lock files, printed commands.

The full-disk tests mount a small tmpfs (root only; they skip with the reason elsewhere).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO

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
    """Room for one checkpoint of the test preset (10.7 MB), not two: the second save fails, the run stops
    at once (it used to hang: DCP's error is a BaseException that killed the saver thread)."""
    ckpt = small_disk("14m")
    proc = subprocess.run([sys.executable, "train.py", "--data", str(tiny_data), "--max-steps", "8",
                           "--save-every", "2", "--eval-every", "100", "--output-dir", str(ckpt), "--log-dir",
                           str(tmp_path / "logs")], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=bound(240))
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = one_error_line(proc)
    run_dir = ckpt / "test-demo-byte-p5"
    assert f"no space left in {run_dir}: checkpoint step-00000004" in line and "needs about 10.3 MB" in line
    assert (run_dir / "step-00000002" / "COMPLETE").is_file(), sorted(run_dir.iterdir())
    # it stopped at the failed save: no later save completed (steps 6, 8, final). The save of step 6 may have begun
    # while step 4's failed in the background: it stays incomplete, which no resume trusts
    later = [p.name for p in run_dir.iterdir() if any(s in p.name for s in ("00000006", "00000008", "final"))
             and (p / "COMPLETE").exists()]
    assert not later, later
    assert not (run_dir / "step-00000008").exists() and not (run_dir / "final").exists()


def test_a_full_disk_under_logs_plot_and_prepared_data_is_one_line(tmp_path, small_disk):
    """The loss plot, training.log and prepare_data.py on a full disk: one line naming the folder."""
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
                          timeout=bound(60))
    assert "Traceback" not in proc.stderr and "Logging error" not in proc.stderr, proc.stderr
    assert f"plot no space left in {disk}: the loss plot loss.png" in proc.stdout, proc.stdout
    assert f"log no space left in {disk}: training.log" in proc.stdout, proc.stdout
    (disk / "filler").unlink()
    (disk / "filler").write_bytes(b"x" * (64 * 1024 - 8192))
    proc = subprocess.run([sys.executable, "prepare_data.py", "demo", "--name", "d", "--out-dir", str(disk),
                           "--tokenizer", "byte", "--dataset-percent", "5"], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=bound(60))
    assert proc.returncode == 2
    assert f"no space left in {disk}: dataset d" in one_error_line(proc)
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "training.log"]  # nothing of the dataset


def test_an_interrupt_under_the_launcher_is_130_and_one_line(tmp_path):
    """A worker's second Ctrl-C (KeyboardInterrupt inside `cli`) reaches utils/launch.py as 130 and one
    line; the launcher said "a training process failed with exit code 1" before."""
    worker = tmp_path / "worker.py"
    worker.write_text("import sys\nfrom utils.errors import cli\n\n@cli\ndef main(argv=None):\n"
                      "    raise KeyboardInterrupt\n\nsys.exit(main())\n")
    proc = subprocess.run([sys.executable, str(REPO / "utils" / "launch.py"), "--cpu", "--num_processes", "1",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(worker)],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=bound(60))
    assert proc.returncode == 130 and one_error_line(proc) == "error: interrupted", proc.stderr[-2000:]


def test_ctrl_c_stops_the_benchmark_script_instead_of_running_the_next_command(tmp_path):
    """train.py stops cleanly on Ctrl-C and exits 0, so shakespeare_char.sh went on to score and to the next
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
    assert proc.wait(timeout=bound(60)) == 130, "".join(seen) + rest
    assert "SIGINT received" in rest and "piconeox shakespeare-char:" not in rest, rest  # no scoring after it
    assert "continue this run: the same command plus --resume auto" in rest, rest  # the next: block
    assert rest.strip().endswith("error: interrupted") and "Traceback" not in rest, rest


def test_damaged_run_inputs_and_tool_outputs_are_one_line(tmp_path, tiny_data):
    """to_gguf's --out over a user's file or inside a checkpoint, the run lock over --log-dir, timeouts, lock files
    that are not lock files, empty settings: each refused in one line with exit 2 (all in one interpreter,
    tests/support/cli.py), and nothing written or replaced."""
    from tests.support.cli import assert_one_error_line, run_cli_cases
    from tests.support.interop_runs import write_run

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    write_run(tmp_path / "runs" / "r", "byte")  # a checkpoint to_gguf exports (so main overwrote the files below)
    best = tmp_path / "runs" / "r" / "best"
    (tmp_path / "empty-dir.yaml").write_text("run:\n  output_dir:\n")
    (tmp_path / "empty-prompt.yaml").write_text("run:\n  sample_prompt:\n")
    (tmp_path / "locks-a-file").mkdir()
    (tmp_path / "locks-a-file" / ".locks").write_text("")
    (tmp_path / "lock-a-folder" / ".locks" / "r.lock").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom utils.run import runlock\n"
                               "with runlock.holding(sys.argv[1], 'r', 'train.py'):\n    print('held', flush=True)\n"
                               "    time.sleep(300)\n", str(tmp_path / "logs")], cwd=REPO, env=ENV,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"  # another run named r writes --log-dir logs
    before = {p: p.is_file() and p.read_bytes() for p in tmp_path.rglob("*") if ".locks" not in p.parts}
    run = ["train", "--data", str(tiny_data), "--run-name", "r", "--max-steps", "1"]
    cases = [
        # to_gguf --out: a user's file, or a file inside a checkpoint
        ("utils.to_gguf", [str(best), "--out", str(notes)], "exists and is not a GGUF file"),
        ("utils.to_gguf", [str(best), "--out", str(best / "model.safetensors")], "is a checkpoint folder"),
        ("utils.to_gguf", [str(best), "--out", str(best / "model.gguf")], "is a checkpoint folder"),
        # the lock covers --log-dir: another --output-dir, the same log folder
        (run[0], [*run[1:], "--output-dir", str(tmp_path / "ckpt2"), "--log-dir", str(tmp_path / "logs")],
         "run r is still being written by pid"),
        # timeouts before the launch
        ("train", ["--preflight", "--step-timeout-minutes", "1e12"], "--step-timeout-minutes 1e+12: must be"),
        ("train", ["--preflight", "--collective-timeout-minutes", "1e12"], "from 0.5 to 10080"),
        ("train", ["--preflight", "--step-timeout-minutes", "0.0001"], "--step-timeout-minutes 0.0001: must be"),
        # lock files that are not lock files
        (run[0], [*run[1:], "--output-dir", str(tmp_path / "locks-a-file")], "is a file, not the folder of run locks"),
        (run[0], [*run[1:], "--output-dir", str(tmp_path / "lock-a-folder")], "is a folder, not a lock file"),
        # settings that say nothing
        ("train", ["--preflight", "--config-file", str(tmp_path / "empty-dir.yaml")], "run.output_dir is empty"),
        ("train", ["--preflight", "--config-file", str(tmp_path / "empty-prompt.yaml")], "run.sample_prompt is empty"),
    ]
    try:
        results = run_cli_cases([(m, argv) for m, argv, _ in cases], tmp_path)
    finally:
        holder.kill()
        holder.wait()
    for (module, argv, message), (code, err) in zip(cases, results):
        assert_one_error_line(code, err, message, f"{module} {' '.join(argv)}")
    after = {p: p.is_file() and p.read_bytes() for p in tmp_path.rglob("*") if ".locks" not in p.parts}
    assert after == before  # nothing written, nothing replaced


def test_the_benchmark_scripts_python_clis_refuse_bad_values_with_one_line(tmp_path):
    from tests.support.cli import assert_cli_table

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert_cli_table([
        ("benchmarks.gpu_check", ["train", "--cpu-smoke", "--out", str(tmp_path / "g"), "--steps", "-3"],
         "--steps: -3 must be at least 1"),
        ("benchmarks.gpu_check", ["train", "--cpu-smoke", "--out", str(tmp_path / "g"), "--steps", "0"],
         "--steps: 0 must be at least 1"),
        ("benchmarks.gpu_check", ["env", "--cpu-smoke", "--out", str(notes)], "is a file, not a folder"),
        ("benchmarks.gpu_check", ["env", "--cpu-smoke", "--out", str(notes / "x")], "is a file, not a folder"),
        ("benchmarks.gpu_check", ["env", "--cpu-smoke", "--out", "/proc/piconeox"], "cannot write in /proc"),
        ("benchmarks.chaos_lifecycle", ["--kills", "-1"], "--kills: -1 must be at least 0"),
        ("benchmarks.chaos_lifecycle", ["--procs", "2", "0"], "--procs: 0 must be at least 1"),
        ("benchmarks.chaos_lifecycle", ["--bogus"], "unrecognized arguments: --bogus"),
        ("benchmarks.phases", ["demo", "--config", "pico-bset"], "unknown preset 'pico-bset'"),
        ("benchmarks.bench_checkpoint", ["--saves", "1"], "--saves: 1 must be at least 2"),
        ("benchmarks.bench_checkpoint", ["--threads", "two"], "--threads: 'two' is not a whole number"),
        ("benchmarks.bench_train", ["--steps", "3"], "--steps: 3 must be at least 6"),
        ("benchmarks.bench_sync", ["--files", "0"], "--files: 0 must be at least 1"),
        ("benchmarks.bench_rp2040", ["--tokens", "0"], "--tokens: 0 must be at least 1"),
        ("benchmarks.bench_pico_kernels", ["--cols", "6"], "--cols: 6 must be at least 8"),
        ("benchmarks.bench_pico_kernels", ["--cols", "12"], "give rows a multiple of 4 and columns a multiple of 8"),
        ("benchmarks.pico_tinystories", ["--tokens", "-1"], "--tokens: -1 must be at least 1"),
        ("benchmarks.ema_effect", ["--bogus"], "unrecognized arguments: --bogus"),
        ("benchmarks.ema_effect", ["--presets", "pico-bset"], "invalid choice: 'pico-bset'"),
        ("benchmarks.bench_rp2040", ["--presets", "rp2040-speed,nope"], "unknown preset 'nope'; valid presets:"),
        ("benchmarks.pico_tinystories", ["--presets", "nope"], "unknown preset 'nope'; valid presets:"),
        ("benchmarks.pico_search", ["--jobs", "0"], "--jobs: 0 must be at least 1"),
        ("benchmarks.pico_search", ["--lr", "-1"], "--lr -1.0: must be above 0"),
        ("benchmarks.phases", ["demo", "--set", "train.max_steps"], "--set 'train.max_steps': expected SECTION.KEY"),
    ], tmp_path)


def test_what_used_to_succeed_silently_is_one_line(tmp_path):
    """rp2040.reference on a text that is not text, or with a checkpoint of another model; a push whose credentials
    file does not exist: one line each instead of a result."""
    from tests.support.cli import assert_cli_table, binary_file
    from tests.support.interop_runs import write_run
    from tests.support.rp2040_models import exported_pico, save_checkpoint

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    write_run(tmp_path / "runs" / "r", "byte")
    exported = exported_pico(tmp_path / "pico")[1]
    other = save_checkpoint("pico-fast", tmp_path / "other")[0]
    png = binary_file(tmp_path / "image.png")
    assert_cli_table([
        ("rp2040.reference", [str(exported), "--text", png], "not UTF-8 at byte 0"),
        ("rp2040.reference", [str(exported), "--text", str(notes), "--checkpoint", str(other)], "is another model"),
        ("utils.push_checkpoint", [str(tmp_path / "runs" / "r"), "--checkpoint-bucket", str(tmp_path / "bucket"),
                                   "--credentials", str(tmp_path / "key.json")], "key.json: no such file"),
    ], tmp_path)


def test_the_printed_next_commands_run_from_another_folder_with_spaces_and_non_ascii(tmp_path):
    """The "next:" commands, as printed, run from another working directory with a run path holding a
    space and non-ASCII letters (they were unquoted, and `-m utils.generate` needs the repository as its folder)."""
    from tests.support.rp2040_models import save_checkpoint
    from utils.report.summary import next_commands

    run_dir = tmp_path / "my runs" / "été"
    save_checkpoint("rp2040-speed", run_dir / "best")
    line = next_commands("test", run_dir, stopped=False).splitlines()[1].strip()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert line.endswith(" --max-new-tokens 200")  # shortened below; a bare "200" may be in pytest's tmp path
    proc = subprocess.run(["bash", "-c", line.removesuffix("200") + "3"], cwd=elsewhere, env=ENV, capture_output=True,
                          text=True, timeout=bound(60))
    assert proc.returncode == 0 and proc.stdout.startswith("Once upon a time"), (line, proc.stderr[-2000:])


def test_fresh_starts_in_one_second_keep_every_earlier_best(tmp_path, monkeypatch):
    """`--resume auto` with no complete checkpoint moves best/ aside; a second fresh start within the same
    second moved its best/ onto the first one's name (a rename onto it failed, or replaced an empty one)."""
    import logging
    import time as clock

    from utils.run.run_folders import keep_earlier_best

    monkeypatch.setattr(clock, "gmtime", lambda *_: clock.struct_time((2026, 11, 26, 18, 0, 0, 3, 330, 0)))
    for attempt in ("first", "second"):
        (tmp_path / "best").mkdir()
        (tmp_path / "best" / "model.safetensors").write_text(attempt)
        keep_earlier_best(tmp_path, logging.getLogger("test"))
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["best-earlier-20261126-180000", "best-earlier-20261126-180000-2"], kept
    assert [(tmp_path / k / "model.safetensors").read_text() for k in kept] == ["first", "second"]
