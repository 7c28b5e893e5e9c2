"""benchmarks/gpu_check.sh in its CPU mode: every stage runs end to end, and each JSON line carries exactly the keys
the GPU mode prints (gpu_check.KEYS), so the check cannot rot before the next GPU is lent."""
import json
import subprocess

from tests.conftest import REPO


def test_cpu_smoke_runs_every_stage_with_the_gpu_keys(tmp_path):
    import benchmarks.gpu_check as check

    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), "all", "--cpu-smoke", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert {line["stage"] for line in lines} == set(check.KEYS)
    for line in lines:
        assert sorted(line) == sorted(["stage", *check.KEYS[line["stage"]]]), line
    by = {line["stage"]: line for line in lines}
    assert by["train"]["ok"] and by["train"]["tok_s"] > 0
    assert by["save"]["staged_gb"] > 0 and by["save"]["blocking_s"] is not None
    assert by["save"]["resume_max_dloss"] < 1e-4  # CPU runs are deterministic: the noise floor is 0
    assert by["fsdp"]["ok"] and by["fsdp"]["resume_max_dloss"] < 1e-4
    assert not (tmp_path / "ckpt").exists()  # the check leaves no checkpoint behind (disk on a lent box)
    for name in ("save-a", "fsdp"):  # train.best_and_final=false: the step checkpoints only (finding 2)
        text = (tmp_path / f"{name}.out").read_text()
        assert "saved checkpoint" in text and "/best" not in text and "/final" not in text, name


def test_gpu_mode_refuses_without_cuda_in_one_line(tmp_path):
    proc = subprocess.run([str(REPO / "benchmarks" / "gpu_check.sh"), "train", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: torch sees no CUDA GPU"), proc.stderr
