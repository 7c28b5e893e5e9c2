"""benchmarks/gpu_check.sh in its CPU mode: every stage runs end to end, and each JSON line carries exactly the keys
the GPU mode prints (gpu_results.KEYS), so the check cannot rot before the next GPU is lent."""
import json
import subprocess
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.waits import command_line, wait_for


def test_cpu_smoke_runs_every_stage_with_the_gpu_keys(tmp_path):
    """--out relative to where the check starts (its runs start inside it: out/out/ once wrote every number None)."""
    from benchmarks.gpu_results import KEYS

    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), "all", "--cpu-smoke", "--out", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=bound(450))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert not (out / "out").exists()
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {line["stage"] for line in lines} == set(KEYS)
    for line in lines:
        assert sorted(line) == sorted(["stage", *KEYS[line["stage"]]]), line
    by = {line["stage"]: line for line in lines}
    for stage in ("train", "fsdp"):  # FSDP2's run measured as the 1-GPU run is (compile off on CPU: none of either)
        assert by[stage]["ok"] and by[stage]["tok_s"] > 0 and by[stage]["first_step_s"] > 0, by[stage]
        assert by[stage]["recompiles"] == 0 and by[stage]["graph_breaks"] == 0, by[stage]
    for stage in ("save", "fsdp"):  # the first save (it pins the staging set) and the later one (it reuses it)
        assert by[stage]["blocking_first_s"] is not None and by[stage]["blocking_later_s"] is not None, by[stage]
    assert by["save"]["ok"] and by["save"]["staged_gb"] > 0
    assert by["save"]["noise_floor_max_dloss"] < 1e-4  # CPU runs are deterministic: the noise floor is 0
    assert by["resume"]["ok"] and by["resume"]["resume_max_dloss"] < 1e-4
    assert by["sdpa"]["backend"] == "FLASH_ATTENTION"  # what torch runs on the CPU (its flash kernel), not forced
    assert by["fsdp-resume"]["ok"] and by["fsdp-resume"]["resume_max_dloss"] < 1e-4
    assert not (out / "ckpt").exists()  # the check leaves no checkpoint behind (disk on a lent box)
    for name in ("save-a", "fsdp"):  # train.best_and_final=false: the step checkpoints only (finding 2)
        text = (out / f"{name}.out").read_text()
        assert "saved checkpoint" in text and "/best" not in text and "/final" not in text, name


def run_check(argv: list[str]) -> int:
    """benchmarks/gpu_check.py's main, called here: its exit code, a refusal's SystemExit included."""
    from benchmarks.gpu_check import main

    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def processes_naming(text: str) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*") if text in " ".join(command_line(int(p.name)))]


@pytest.mark.parametrize("stage, run", [("train", None), ("save", None), ("fsdp", None), ("resume", "save-a"),
                                        ("fsdp-resume", "fsdp")])
def test_a_run_past_its_limit_is_an_ok_false_line_and_nothing_of_it_is_left(tmp_path, capsys, stage, run):
    """A limit no run can meet (the launcher alone imports torch for longer): the run is killed at it, whatever it
    was doing, and the stage records it instead of a TimeoutExpired traceback. A resume whose run never got to
    train compares nothing: its history still holds only the first run's rows (which equal themselves)."""
    out = tmp_path / "out"
    if run:  # what the resume stage looks for before it starts its run
        (out / "ckpt" / run / "step-00000003").mkdir(parents=True)
        (out / "logs" / run).mkdir(parents=True)
        rows = [{"step": s, "train/loss": 5.0 - s / 10} for s in range(1, 7)]
        (out / "logs" / run / "history.json").write_text(json.dumps(rows))
    assert run_check([stage, "--cpu-smoke", "--out", str(out), "--limit-s", "0.3"]) == 1
    captured = capsys.readouterr()
    line = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
    assert line["stage"] == stage and line["ok"] is False, line
    assert line.get("resume_max_dloss", line.get("tok_s", line.get("blocking_first_s"))) is None, line
    assert f"{stage} " in captured.out and "ok=False" in captured.out, captured.out  # the readable row
    # the resume stages' launcher refuses the empty step folder in its preflight, which no longer imports torch:
    # on a quiet box that refusal can come before 0.3 s; killed or refused, the resume compares nothing
    ended = "past its limit of 0.3 s" in captured.err or (run and "has no COMPLETE marker" in captured.err)
    assert ended and "Traceback" not in captured.err, captured.err
    wait_for("every process of the killed run to be gone", lambda: not processes_naming(str(out)), timeout=bound(30))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this box has a CUDA GPU")
def test_the_python_cli_refuses_without_cuda_in_one_line(tmp_path, capsys):
    """gpu_check.py called without the .sh agrees with it: no ok=False line and exit 0, no run started."""
    assert run_check(["train", "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: torch sees no CUDA GPU") and "CPU-only build" in err, err
    assert err.count("\n") == 1 and not (tmp_path / "g" / "results.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (["save", "--steps", "1"], "--steps 1: the save stage needs an even number of at least 2"),
    (["resume", "--steps", "3"], "--steps 3: the resume stage needs an even number of at least 2"),
    (["fsdp", "--steps", "1"], "--steps 1: the fsdp stage needs an even number"),
    (["fsdp-resume", "--steps", "5"], "--steps 5: the fsdp-resume stage needs an even number"),
    (["all", "--steps", "7"], "--steps 7: the all stage needs an even number"),
    (["env", "--variant", "micro_x2"], "--variant micro_x2 is for the train stage, not env"),
    (["train", "--limit-s", "0"], "--limit-s 0: must be above 0 seconds"),
    (["train", "--limit-s", "nan"], "--limit-s nan: must be above 0 seconds"),
    (["resume"], "save-a/step-00000003 is missing: run the save stage (same --out and --steps) first"),
    (["fsdp-resume"], "fsdp/step-00000003 is missing: run the fsdp stage (same --out and --steps) first"),
])
def test_every_stage_refuses_a_bad_argument_in_one_line(tmp_path, capsys, args, message):
    assert run_check([*args, "--cpu-smoke", "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_the_save_stage_with_one_step_is_one_line_from_the_script(tmp_path):
    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), "save", "--steps", "1", "--cpu-smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=bound(150))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: --steps 1: the save stage needs an even number of at least 2"), proc.stderr


def test_the_steps_during_a_write_are_those_that_ran_entirely_while_it_went_on():
    from benchmarks.gpu_runs import steps_during_write

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
                          timeout=bound(60))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_gpu_mode_refuses_without_cuda_in_one_line(tmp_path):
    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), "train", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=bound(60))
    assert proc.returncode == 2 and proc.stderr.startswith("error: torch sees no CUDA GPU"), proc.stderr
