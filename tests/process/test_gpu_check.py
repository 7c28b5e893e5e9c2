"""benchmarks/gpu_check.sh in its CPU mode: every stage runs end to end, and each JSON line carries exactly the keys
the GPU mode prints (gpu_results.KEYS), so the check cannot rot before the next GPU is lent."""
import json
import subprocess

import pytest

from tests.support.paths import REPO


def test_cpu_smoke_runs_every_stage_with_the_gpu_keys(tmp_path):
    """--out relative to where the check starts (its runs start inside it: out/out/ once wrote every number None)."""
    from benchmarks.gpu_results import KEYS

    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), "all", "--cpu-smoke", "--out", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert not (out / "out").exists()
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {line["stage"] for line in lines} == set(KEYS)
    for line in lines:
        assert sorted(line) == sorted(["stage", *KEYS[line["stage"]]]), line
    by = {line["stage"]: line for line in lines}
    assert by["train"]["ok"] and by["train"]["tok_s"] > 0
    assert by["save"]["staged_gb"] > 0 and by["save"]["blocking_s"] is not None
    assert by["save"]["noise_floor_max_dloss"] < 1e-4  # CPU runs are deterministic: the noise floor is 0
    assert by["resume"]["ok"] and by["resume"]["resume_max_dloss"] < 1e-4
    assert by["sdpa"]["backend"] == "FLASH_ATTENTION"  # what torch runs on the CPU (its flash kernel), not forced
    assert by["fsdp"]["ok"] and by["fsdp"]["resume_max_dloss"] < 1e-4
    assert not (out / "ckpt").exists()  # the check leaves no checkpoint behind (disk on a lent box)
    for name in ("save-a", "fsdp"):  # train.best_and_final=false: the step checkpoints only (finding 2)
        text = (out / f"{name}.out").read_text()
        assert "saved checkpoint" in text and "/best" not in text and "/final" not in text, name


def test_the_steps_during_a_write_are_those_that_ran_entirely_while_it_went_on():
    from benchmarks.gpu_check import steps_during_write

    rows = {s: {"train/step_time_s": t} for s, t in enumerate([1.0, 1.0, 1.0, 3.5, 1.2, 1.2, 1.2, 1.0], start=1)}
    # saved after step 3; step 4 holds the 2.5 s copy, the 4 s write covers step 4's last second and steps 5-6
    assert steps_during_write(rows, 3, 2.5, 4.0) == [5, 6]
    assert steps_during_write(rows, 3, 2.5, 0.5) == []  # a write shorter than a step: no ratio, not a made-up one


def test_a_parent_package_without_the_module_is_not_importable():
    """find_spec raises where `google` is a namespace without `cloud` (google_crc32c alone installed)."""
    from benchmarks.gpu_kernels import importable

    assert importable("json") and not importable("json.no_such_package.storage")


@pytest.mark.parametrize("args, message", [
    (["--python-version", "3"], "--python-version '3' is not a Python 3 version X.Y"),
    (["--python-version"], "--python-version needs a value"),
    (["--bogus"], "unknown option '--bogus'"),
])
def test_gpu_wheels_refuses_bad_options_in_one_line(args, message):
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_wheels.sh"), *args], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_gpu_mode_refuses_without_cuda_in_one_line(tmp_path):
    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), "train", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: torch sees no CUDA GPU"), proc.stderr
