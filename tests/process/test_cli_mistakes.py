"""Mistakes in using the CLIs, as processes. The launcher's checks run before anything
starts; the scripts' refusals are one `error:` line and exit 2 (the Python CLIs in one interpreter)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.cli import assert_one_error_line, run_cli_cases
from tests.support.paths import REPO

LAUNCHER = REPO / "start_training.sh"


def launch(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PICONEOX_FAKE_GPUS", "GLOO_SOCKET_IFNAME")}
    return subprocess.run(["bash", str(LAUNCHER), *args], cwd=cwd, env={**clean, **env}, capture_output=True,
                          text=True, timeout=bound(60))


def test_script_mistakes_are_one_line_before_any_work(tmp_path):
    """Unchecked: a CalledProcessError after a first run, tracebacks, an empty table, an internal message."""
    (tmp_path / "tiny.txt").write_text("a few words\n")
    cases = [
        ("benchmarks.ema_effect", ["--presets", "pico-fast", "--decays", "0", "1"], "train.ema_decay=1.0: must be"),
        ("benchmarks.ema_effect", ["--presets", "pico-fast", "--set", "train.bogus=1"], "unknown train setting"),
        ("benchmarks.ema_effect", ["--set", "max_steps"], "--set 'max_steps': expected SECTION.KEY=VALUE"),
        ("benchmarks.char_val_loss", [], "the following arguments are required: kind, checkpoint, data"),
        ("benchmarks.char_val_loss", ["piconeox", str(tmp_path / "none"), str(tmp_path)], "no such checkpoint"),
        ("benchmarks.char_val_loss", ["nanogpt", str(tmp_path), str(tmp_path)], "ckpt.pt: no such file"),
        ("benchmarks.bench_data", ["--rounds", "3"], "unrecognized arguments: --rounds 3"),
        ("benchmarks.budget_levers", ["--steps", "5", "--lever", "lr"], "expected NAME=KEY=VALUE[,KEY=VALUE] or NAME="),
        ("benchmarks.budget_levers", ["--steps", "5", "--lever", "x=train.bogus=1"], "unknown train setting"),
        ("benchmarks.budget_levers", ["--steps", "5", "--lever", "x=train.seed"], "'train.seed' has no value"),
        ("benchmarks.budget_levers", ["--steps", "0", "--lever", "base="], "--steps 0: expected a positive number"),
        ("benchmarks.budget_levers", ["--steps", "5", "--lever", "base=", "--text", "none.txt"], "none.txt: no such"),
        ("benchmarks.bench_math", ["--presets", ""], "--presets '' names no preset"),
        ("benchmarks.bench_math", ["--presets", ", ,"], "names no preset"),
        ("benchmarks.bench_rp2040", ["--presets", "small"], "'small' is not a Pico-sized preset; allowed: rp2040-"),
        ("train", ["--print-sharding", "--gpus", "-1"], "--gpus: -1 must be at least 0"),
        ("train", ["--print-plan", "--gpus", "x"], "--gpus: 'x' is not a whole number"),
        ("benchmarks.phases", ["missing.txt"], "missing.txt: no such file"),
        ("benchmarks.phases", [str(tmp_path)], "not a file"),
        # a relative path is this folder's, not the repository's: prepared, then too short for the preset
        ("benchmarks.phases", ["tiny.txt"], "0 blocks of seq_len 64"),  # last: it wraps train's functions
    ]
    results = run_cli_cases([(m, argv) for m, argv, _ in cases] + [("benchmarks.bench_data", ["--help"])], tmp_path)
    for (module, argv, message), (code, err) in zip(cases, results):
        assert_one_error_line(code, err, message, f"{module} {' '.join(argv)}")
    assert results[-1] == [0, ""]  # --help explains instead of running the benchmark


def test_an_unusable_tmpdir_is_no_raw_mktemp_line(tmp_path):
    """Unchecked, every launch stopped with `mktemp: failed to create file` and exit 1."""
    proc = launch("--config", "nope", "--gpus", "0", cwd=tmp_path, TMPDIR=str(tmp_path / "missing"))
    assert proc.returncode == 2 and "mktemp" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"warning: TMPDIR {tmp_path / 'missing'} is missing, read-only or full; "
                                  "temporary files go to ")
    assert_one_error_line(proc.returncode, proc.stderr, "error: unknown preset 'nope'")


@pytest.mark.parametrize("args, env, message", [
    (["--num-machines", "2", "--machine-rank", "1", "--main-process-ip", "999.1.1.1"], {},
     "--main-process-ip '999.1.1.1' is not an IPv4 address"),
    (["--num-machines", "2", "--machine-rank", "1", "--main-process-ip", "10.0.0.1:29500"], {},
     "pass --main-process-ip 10.0.0.1 --main-process-port 29500"),
    (["--num-machines", "2", "--machine-rank", "1", "--main-process-ip", "10.0.0.1:29500"],
     {"GLOO_SOCKET_IFNAME": "lo"}, "carries a port"),  # checked even when the interface is the user's choice
    (["--accelerate-config", "configs"], {}, "--accelerate-config 'configs' is a folder, not a config file"),
    (["--accelerate-config", "README.md"], {}, "--accelerate-config 'README.md' is not YAML at line"),
])
def test_launch_settings_that_cannot_work_stop_before_the_launch(args, env, message):
    """Unchecked: a warning and exit 0, "does not exist" for a folder, or accelerate's traceback later."""
    proc = launch("--dry-run", "--config", "production", "--gpus", "8", *args, cwd=REPO, PICONEOX_FAKE_GPUS="8", **env)
    assert proc.stdout == "", proc.stdout
    assert_one_error_line(proc.returncode, proc.stderr, message)


def test_a_gloo_interface_that_does_not_exist_stops_the_preflight(tmp_path):
    """Unchecked, gloo raised in every rank after the launch, one traceback each."""
    proc = launch("--config", "test", "--gpus", "0", "--procs", "2", "--data", str(tmp_path / "none"), cwd=tmp_path,
                  GLOO_SOCKET_IFNAME="eth-nope")
    assert_one_error_line(proc.returncode, proc.stderr, "GLOO_SOCKET_IFNAME='eth-nope' names no network interface")


def test_consolidate_on_a_full_disk_is_one_line_and_leaves_nothing(trained, tmp_path):
    """safetensors' SafetensorError is no OSError: the ENOSPC net let its traceback through."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True,
                           text=True)
    if mount.returncode:
        pytest.skip(f"a full disk is a small tmpfs, and mounting one needs root (mount said: {mount.stderr.strip()})")
    try:
        proc = subprocess.run([sys.executable, "-m", "utils.consolidate", str(trained / "ckpt" / "run" / "final"),
                               "--out", str(disk / "hf")], cwd=REPO, capture_output=True, text=True, timeout=bound(60),
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert_one_error_line(proc.returncode, proc.stderr, f"no space left in {disk}: --out {disk / 'hf'}")
        assert list(disk.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
