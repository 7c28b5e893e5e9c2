"""A dataset and a run's checkpoints in s3:// on moto's server, end to end through the commands a user types: push the
dataset, train from it with --checkpoint-bucket s3://, then continue in a fresh folder with --resume auto from the
bucket's newest complete step. Bad S3 input is one line in each command."""
import json
import socket
import subprocess
import sys

import pytest

from tests.support.bounds import bound
from tests.support.cli import assert_one_error_line, run_cli_cases
from tests.support.paths import REPO
from tests.support.s3_servers import SECRET
from tests.support.training import TINY
from utils.crc import INDEX_NAME

pytestmark = pytest.mark.usefixtures("one_thread")
STEPS = ("--save-every", "10", "--eval-every", "100", "--keep-last", "2")


def command(cwd, *argv) -> subprocess.CompletedProcess:
    """`python argv` in `cwd` with this test's AWS variables; it must end without a traceback or the secret key."""
    proc = subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, capture_output=True, text=True,
                          timeout=bound(300))
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output and SECRET not in output, output
    return proc


def train(work, folder: str, *extra) -> subprocess.CompletedProcess:
    return command(work, REPO / "train.py", *TINY, "--run-name", "run", "--output-dir", work / folder / "ckpt",
                   "--log-dir", work / folder / "logs", "--sample-tokens", "0", *STEPS, *extra)


def losses(log_dir) -> dict[int, float]:
    rows = json.loads((log_dir / "run" / "history.json").read_text())
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_push_train_and_resume_from_a_fresh_folder_through_s3(s3_server, tiny_data, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    data, ckpt = s3_server.url("data/tiny"), s3_server.url("ckpt")
    pushed = command(work, REPO / "download_training_data.py", "--push", tiny_data, "--dest", data, "--quiet")
    assert pushed.returncode == 0 and "failed 0" in pushed.stdout, pushed.stderr
    shipped = sorted(f"data/tiny/{p.name}" for p in tiny_data.iterdir() if p.name != INDEX_NAME)
    assert s3_server.names("data/tiny/") == shipped and "data/tiny/manifest.json" in shipped

    first = train(work, "a", "--data", data, "--checkpoint-bucket", ckpt, "--max-steps", "20")
    assert first.returncode == 0, first.stderr
    assert {"ckpt/run/step-00000010/COMPLETE", "ckpt/run/step-00000020/COMPLETE"} <= set(s3_server.names("ckpt/"))
    cache = work / "data" / "gcs-cache" / socket.gethostname() / "s3" / s3_server.bucket / "data" / "tiny"
    assert (cache / "manifest.json").read_bytes() == (tiny_data / "manifest.json").read_bytes()
    s3_server.put("ckpt/run/step-00000030/__0_0.distcp", b"an upload cut short: no COMPLETE")

    resumed = train(work, "b", "--data", data, "--checkpoint-bucket", ckpt, "--max-steps", "30", "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    log = (work / "b" / "logs" / "run" / "training.log").read_text()
    assert ".remote-cache" in log and "step-00000020 at step 20" in log, log
    assert "ckpt/run/step-00000030/COMPLETE" in s3_server.names("ckpt/")  # the cut-short step 30, replaced whole
    assert SECRET not in log

    before, after = losses(work / "a" / "logs"), losses(work / "b" / "logs")
    assert list(after) == list(range(1, 31)) and {s: after[s] for s in before} == before  # its history came along


def test_bad_s3_input_is_one_line_in_each_command(s3_server, tiny_data, tmp_path, monkeypatch):
    missing = "s3://no-such-bucket/data/tiny"
    cases = [
        ("train", [*TINY, "--data", "s3://Bad_Bucket/tiny", "--output-dir", str(tmp_path / "c")], "bad bucket name"),
        ("train", [*TINY, "--data", str(tiny_data), "--checkpoint-bucket", "s3://x/ckpt"], "bad bucket name 'x'"),
        ("train", [*TINY, "--data", missing, "--output-dir", str(tmp_path / "c")], "no-such-bucket"),
        ("download_training_data", ["--source", missing, "--dest", str(tmp_path / "d")], "no-such-bucket"),
        ("download_training_data", ["--push", str(tiny_data), "--dest", "s3://Bad_Bucket/x"], "bad bucket name"),
    ]
    for (module, argv, message), (code, err) in zip(cases, run_cli_cases([(m, a) for m, a, _ in cases], tmp_path)):
        assert_one_error_line(code, err, message, f"{module} {argv}")
        assert SECRET not in err
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    cases = [("download_training_data", ["--push", str(tiny_data), "--dest", s3_server.url("d")]),
             ("train", [*TINY, "--data", s3_server.url("d"), "--output-dir", str(tmp_path / "c")]),
             ("train", [*TINY, "--data", str(tiny_data), "--checkpoint-bucket", s3_server.url("ckpt"),
                        "--output-dir", str(tmp_path / "c")])]
    for (module, argv), (code, err) in zip(cases, run_cli_cases(cases, tmp_path)):
        assert_one_error_line(code, err, "no AWS credentials found", f"{module} {argv} without credentials")


def test_the_launcher_refuses_bad_s3_settings_in_its_preflight(s3_server, tmp_path, monkeypatch):
    """start_training.sh: one line from the preflight, before any worker starts."""
    cases = [(["--data", "s3://Bad_Bucket/data"], "bad bucket name 'Bad_Bucket'"),
             (["--data", s3_server.url("data"), "--", "--checkpoint-bucket", s3_server.url("ckpt")],
              "no AWS credentials found")]
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    for extra, message in cases:
        proc = subprocess.run([str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", *extra],
                              cwd=tmp_path, capture_output=True, text=True, timeout=bound(60))
        assert_one_error_line(proc.returncode, proc.stderr, message, " ".join(extra))
        assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
