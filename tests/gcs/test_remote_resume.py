"""Resuming from the bucket and from damaged local folders; kill -9 at random points loses nothing."""
import json
import random
import shlex
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.training import TINY, run
from utils.ckpt.format import check_complete, latest_complete, step_dir_name
from utils.ckpt.bucket.remote import latest_complete_step, remote_steps
from utils.ckpt.resume import candidates, fetch
from utils.errors import PiconeoxError
from utils.storage import open_storage

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")


def test_kill_9_at_five_random_points_then_resume_gives_the_uninterrupted_losses(tmp_path, tiny_data, gcs_emulator):
    common = ("--max-steps", "150", "--save-every", "5", "--eval-every", "50", "--keep-last", "2")
    _, straight, _ = run(tmp_path / "straight", tiny_data, *common)
    common += ("--checkpoint-bucket", gcs_emulator.url("ckpt"))
    out = tmp_path / "killed"
    cmd = [sys.executable, "train.py", *TINY, "--data", str(tiny_data), "--run-name", "run", "--output-dir",
           str(out / "ckpt"), "--log-dir", str(out / "logs"), "--resume", "auto", *common]
    run_dir, rng = out / "ckpt" / "run", random.Random(5)
    remote = open_storage(gcs_emulator.url("ckpt/run"))

    def local_step() -> int:
        newest = latest_complete(run_dir, warn=lambda _: None)
        return int(newest.name[5:]) if newest else 0

    def wait_until(done, proc) -> None:
        deadline = time.monotonic() + bound(180)  # a hang bound: seconds here, minutes on a loaded box
        while not done():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.01)

    for kill in range(5):
        start = local_step()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        target = start + 5 * rng.randint(1, 4)
        wait_until(lambda: local_step() >= target, proc)  # it trains past its resume point
        wipe = kill % 2 == 1  # then the machine is lost: only the bucket is left
        if wipe:
            wait_until(lambda: (latest_complete_step(remote_steps(remote)) or 0) > start, proc)
        time.sleep(rng.uniform(0, 0.1))  # and it dies anywhere: in a step, a write, an upload
        assert proc.poll() is None, "finished before it was killed: raise --max-steps"
        proc.kill()
        proc.wait()
        if wipe:
            shutil.rmtree(out / "ckpt")
    code, resumed, _ = run(out, tiny_data, *common, "--resume", "auto")
    assert code == 0 and len(resumed) == 150
    assert resumed == straight
    log = (out / "logs" / "run" / "training.log").read_text()
    resumes = [line for line in log.splitlines() if "resumed from" in line]
    assert len(resumes) == 5 and len([line for line in resumes if ".remote-cache" in line]) == 2


@pytest.fixture
def remote_run(tmp_path, tiny_data, gcs_emulator):
    """A trained run with complete remote step-10 and step-20, then step-20's marker lost and a markerless step-30."""
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "20", "--save-every", "10", "--eval-every", "100",
                     "--checkpoint-bucket", gcs_emulator.url("ckpt"), "--no-background-upload")
    assert code == 0
    gcs_emulator.client.bucket(gcs_emulator.bucket).blob("ckpt/run/step-00000020/COMPLETE").delete()
    gcs_emulator.put("ckpt/run/step-00000030/__0_0.distcp", b"cut short")
    return gcs_emulator


def test_remote_folder_without_marker_is_never_chosen(tmp_path, tiny_data, remote_run, capsys):
    url = remote_run.url("ckpt/run")
    assert remote_steps(open_storage(url)) == {10: True, 20: False, 30: False}
    [point] = candidates(url, tmp_path, None, None, 60, print)
    folder = fetch(point, tmp_path / "cache", None, 60)
    assert folder.name == "step-00000010" and check_complete(folder, verify=True) is None
    with pytest.raises(PiconeoxError, match="step-00000030: no COMPLETE marker there"):
        candidates(f"{url}/step-00000030", tmp_path, None, None, 60, print)
    # the trainer, on a fresh machine, resumes from the bucket's step 10
    code, losses, _ = run(tmp_path / "fresh", tiny_data, "--max-steps", "12", "--resume", url)
    log = (tmp_path / "fresh" / "logs" / "run" / "training.log").read_text()
    assert code == 0 and len(losses) == 12 and "step-00000010 at step 10" in log
    assert run(tmp_path / "fresh", tiny_data, "--max-steps", "12", "--resume", f"{url}/step-00000020")[0] == 2
    err = capsys.readouterr().err
    assert "error: --resume gs://" in err and "step-00000020: no COMPLETE marker there" in err
    assert "Traceback" not in err


def test_truncated_local_checkpoint_falls_back_to_the_previous(tmp_path, tiny_data):
    code, _, run_dir = run(tmp_path, tiny_data, "--max-steps", "20", "--save-every", "10", "--eval-every", "100")
    assert code == 0
    weights = run_dir / "step-00000020" / "__0_0.distcp"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size // 2)
    shutil.rmtree(run_dir / "final")
    code, losses, _ = run(tmp_path, tiny_data, "--max-steps", "25", "--save-every", "10", "--eval-every", "100",
                          "--resume", "auto")
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    skipped = [line for line in log.splitlines() if "skipping checkpoint" in line]
    assert code == 0 and len(losses) == 25
    assert len(skipped) == 1 and f"__0_0.distcp has {size // 2} bytes, expected {size}" in skipped[0]
    assert f"resumed from {run_dir / 'step-00000010'} at step 10" in log
    # a missing file is reported the same way
    (run_dir / "step-00000020" / "scheduler.json").unlink()
    assert check_complete(run_dir / "step-00000020").endswith("is damaged: scheduler.json is missing")


def test_auto_prefers_a_newer_local_checkpoint_over_the_bucket(tmp_path, tiny_data, remote_run):
    """Local step-20 is complete while the bucket's newest complete one is step-10: no download."""
    code, losses, _ = run(tmp_path, tiny_data, "--max-steps", "22", "--resume", "auto",
                          "--checkpoint-bucket", remote_run.url("ckpt"))
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    assert code == 0 and len(losses) == 22
    assert f"resumed from {tmp_path / 'ckpt' / 'run' / 'step-00000020'} at step 20" in log
    assert not (tmp_path / "ckpt" / ".remote-cache").exists()


def test_bucket_down_at_start_resumes_locally_and_training_goes_on(tmp_path, tiny_data, monkeypatch):
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "10", "--save-every", "5", "--eval-every", "100")
    assert code == 0
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{s.getsockname()[1]}")
    code, losses, run_dir = run(tmp_path, tiny_data, "--max-steps", "12", "--save-every", "5", "--eval-every", "100",
                                "--resume", "auto", "--checkpoint-bucket", "gs://piconeox-down/ckpt",
                                "--grace-seconds", "1")
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    assert code == 3 and len(losses) == 12  # trained, but its newest checkpoint is not in the bucket
    assert "bucket gs://piconeox-down/ckpt/run: cannot list it" in log
    assert "not confirmed there: step-00000005, step-00000010, step-00000012" in log
    assert "--resume auto: could not list gs://piconeox-down/ckpt/run, using local checkpoints only" in log
    assert f"resumed from {run_dir / 'step-00000010'} at step 10" in log
    assert "step-00000012: upload failed" in log and "(1 failure(s) in a row, 1 in total; fatal at 3)" in log
    assert check_complete(run_dir / "step-00000012") is None
    history = json.loads((tmp_path / "logs" / "run" / "history.json").read_text())
    assert [h["upload/failures"] for h in history if "upload/failures" in h] == [1]  # also in TensorBoard


def test_a_checkpoint_that_never_reached_a_directory_bucket_exits_3_and_push_finishes_it(tmp_path, tiny_data, capsys):
    """A directory as --checkpoint-bucket; no best/ suggested when none exists."""
    from utils import push_checkpoint
    from utils.ckpt.bucket.remote import newest_verified

    bucket = tmp_path / "bucket"  # a file as the bucket itself is refused before the run
    bucket.mkdir()
    (bucket / "run").write_text("a file where the run's folder in the bucket should be: every upload fails")
    # a time limit stops it before its first evaluation (the one at --max-steps)
    code, losses, run_dir = run(tmp_path, tiny_data, "--max-steps", "1000", "--save-every", "2", "--eval-every", "1000",
                                "--max-training-hours", "0.0005", "--checkpoint-bucket", str(bucket),
                                "--max-upload-failures", "1000", "--grace-seconds", "1")
    err = capsys.readouterr().err
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    last = step_dir_name(len(losses))
    assert code == 3 and f"stopped at step {len(losses)}: time limit" in log
    assert f"bucket {bucket}/run: " in log and f"{last}" in log.split(f"bucket {bucket}/run: ")[1].splitlines()[0]
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: {last} never reached {bucket}/run; upload it with: ")
    assert f"utils/push_checkpoint.py {run_dir} --checkpoint-bucket {bucket}" in line
    next_block = log.split("next:", 1)[1]
    assert "/best" not in next_block and f"utils.generate {run_dir / 'final'}" in next_block  # no eval ran: no best/

    (bucket / "run").unlink()  # the bucket is back: the printed command, as printed, from another folder, finishes it
    done = subprocess.run(shlex.split(line.split("upload it with: ", 1)[1]), cwd=tmp_path, capture_output=True,
                          text=True)
    assert done.returncode == 0 and done.stdout.startswith("uploaded "), done.stderr
    assert newest_verified(open_storage(str(bucket)).child("run"), {len(losses): True}, print)[0] == len(losses)
    assert push_checkpoint.main([str(run_dir), "--checkpoint-bucket", str(bucket)]) == 0
    assert "was already there, verified" in capsys.readouterr().out
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", str(len(losses) + 1), "--checkpoint-bucket", str(bucket),
                     "--resume", "auto")
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    newest = step_dir_name(len(losses) + 1)
    # exit 0: the newest is there (an older local step of the first attempt is still listed as never arrived)
    assert code == 0 and f"bucket {bucket}/run: newest verified checkpoint {newest}" in log


def test_auto_skips_a_damaged_bucket_step_and_keeps_an_earlier_best(tmp_path, tiny_data):
    """An object of the newest bucket step that no longer matches its marker's crc32c makes
    --resume auto fall back to the previous complete bucket step, as locally; a --resume auto that finds
    nothing starts fresh without replacing the earlier attempt's best/."""
    bucket = tmp_path / "bucket"
    code, _, run_dir = run(tmp_path / "a", tiny_data, "--max-steps", "4", "--save-every", "2", "--eval-every", "2",
                           "--checkpoint-bucket", str(bucket))
    assert code == 0
    damaged = bucket / "run" / "step-00000004" / "trainer.json"
    damaged.write_bytes(damaged.read_bytes().replace(b"4", b"5", 1))  # same size, other bytes
    code, losses, _ = run(tmp_path / "b", tiny_data, "--max-steps", "5", "--save-every", "100", "--eval-every", "100",
                          "--resume", "auto", "--checkpoint-bucket", str(bucket))
    log = (tmp_path / "b" / "logs" / "run" / "training.log").read_text()
    assert code == 0 and f"skipping bucket checkpoint {bucket}/run/step-00000004: trainer.json has" in log
    assert "at step 2 (" in log and len(losses) == 5  # history of steps 1-2 from the checkpoint, then 3-5

    best = {p.name: p.read_bytes() for p in (run_dir / "best").iterdir()}
    for folder in [*run_dir.glob("step-*"), run_dir / "final"]:  # as if stopped before its first checkpoint
        shutil.rmtree(folder)
    code, _, _ = run(tmp_path / "a", tiny_data, "--max-steps", "2", "--eval-every", "1", "--resume", "auto")
    (kept,) = run_dir.glob("best-earlier-*")
    assert code == 0 and {p.name: p.read_bytes() for p in kept.iterdir()} == best and (run_dir / "best").is_dir()
