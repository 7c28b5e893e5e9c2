"""A run refused after its checks exits 2 and takes back what it created: the earlier run's files stay byte for byte,
and no folder of the refused name is left (in-process, then through the launcher on 1 and 2 processes); what counts
as an earlier run, and what a refused attempt may remove."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.cli import assert_one_error_line
from tests.support.paths import REPO
from tests.support.training import TINY, reset_accelerate_state


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
