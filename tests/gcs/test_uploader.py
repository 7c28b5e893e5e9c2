"""The checkpoint uploader against real GCS servers on 127.0.0.1, with real snapshots of a real model.

A server that dies (and comes back) is gcp-storage-emulator on a fixed port with its objects on disk:
stopping it closes the port, restarting it on the same port serves the same objects.
"""
import logging
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from configs.model import ModelConfig, build_model
from tests.support.bounds import bound
from tests.support.training import run
from utils.ckpt.format import MARKER, check_complete, read_marker, step_dir_name, step_folders
from utils.ckpt.load import load_model, read_part
from utils.ckpt.parts import Registry, TrainerState, training_parts
from utils.ckpt.bucket.remote import download_checkpoint, latest_complete_step, remote_steps
from utils.ckpt.state import Snapshot
from utils.ckpt.uploader import CheckpointUploader, SaveRequest
from utils.data.loader import BlockLoader
from utils.data.tokenizers import load_tokenizer
from utils.errors import PiconeoxError
from utils.lm import lm_loss
from utils.optim import build_optimizer, build_scheduler
from utils.report.metrics import MetricsWriter
from utils.storage import Storage, open_storage

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state")

TIMEOUT_S = 2.0  # per storage call, retries included: a dead server fails an upload in ~2 s


class Trainer:
    """A tiny GPT-NeoX really training on the demo corpus; `snapshot()` captures it like train.py does."""

    def __init__(self, data_dir: Path, log_dir: Path):
        torch.manual_seed(0)
        cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64, max_position_embeddings=32,
                          vocab_size=256)
        self.model = build_model(cfg)
        self.optimizer = build_optimizer(self.model, 3e-3, 0.1, (0.9, 0.95))
        self.scheduler = build_scheduler(self.optimizer, 2, 100, 0.1)
        self.loader = BlockLoader(data_dir, "train", 32, 4, seed=1)
        self.tokenizer = load_tokenizer(data_dir)
        self.metrics = MetricsWriter(log_dir, True)
        self.state = TrainerState()
        self.run_config = {"model": cfg.to_dict()}

    def step(self) -> None:
        x, y = next(self.loader)
        lm_loss(self.model, x, y).backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1

    def snapshot(self) -> Snapshot:
        parts = training_parts(scheduler=self.scheduler, scaler=None, loader=self.loader, trainer=self.state,
                               metrics=self.metrics)
        registry = Registry(self.model, self.optimizer, parts, run_config=self.run_config, tokenizer=self.tokenizer)
        return registry.capture(self.state.step)


@pytest.fixture(autouse=True)
def logs_reach_caplog(monkeypatch, caplog):
    """train.py's setup_logging stops "piconeox" records at its own handlers; let caplog see them here."""
    monkeypatch.setattr(logging.getLogger("piconeox"), "propagate", True)
    caplog.set_level(logging.INFO, logger="piconeox")


@pytest.fixture
def trainer(tiny_data, tmp_path) -> Trainer:
    return Trainer(tiny_data, tmp_path / "logs")


class RestartableEmulator:
    """gcp-storage-emulator on a fixed port with its objects on disk: stop() kills it, start() brings it back."""

    def __init__(self, data_dir: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.data_dir = data_dir
        self.host = f"http://127.0.0.1:{self.port}"
        self._server = None

    def start(self) -> None:
        from gcp_storage_emulator.server import create_server

        self._server = create_server("127.0.0.1", self.port, in_memory=False, data_dir=str(self.data_dir))
        self._server.start()

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture
def emulator(tmp_path, monkeypatch):
    from tests.support.gcs_servers import use_server

    server = RestartableEmulator(tmp_path / "server")
    server.start()
    use_server(server.host, monkeypatch, "ckpt-bucket")
    yield server
    server.stop()


class DiesDuringUpload(Storage):
    """The real storage; once armed, `kill()` runs right before the `at`-th file transfer."""

    def __init__(self, inner: Storage, kill, state: dict | None = None):
        self.inner, self.kill, self.url = inner, kill, inner.url
        self.state = state if state is not None else {"at": None, "puts": 0}

    def arm(self, at: int) -> None:
        self.state.update(at=at, puts=0)

    def put(self, local_path, name, *, if_absent=False):
        self.state["puts"] += 1
        if self.state["puts"] == self.state["at"]:
            self.kill()
        return self.inner.put(local_path, name, if_absent=if_absent)

    def child(self, sub):
        return DiesDuringUpload(self.inner.child(sub), self.kill, self.state)

    def list(self, prefix="", *, checksums=True):
        return self.inner.list(prefix, checksums=checksums)

    def get(self, name, local_path):
        return self.inner.get(name, local_path)

    def put_bytes(self, data, name, *, if_absent=False):
        return self.inner.put_bytes(data, name, if_absent=if_absent)

    def delete(self, name):
        return self.inner.delete(name)

    def exists(self, name):
        return self.inner.exists(name)


def latest_loads(store: Storage, cache: Path) -> int:
    """Download the remote latest complete checkpoint and load it like a resume does; return its step."""
    step = latest_complete_step(remote_steps(store))
    folder = download_checkpoint(store, step, cache, progress=False)
    model = load_model(folder)  # crc32c-verified against the marker
    assert read_part(folder, "trainer")["step"] == step and model.num_parameters() > 0
    return step


def test_background_upload_marker_last_and_bytes_equal(trainer, tmp_path, fake_gcs):
    run_dir = tmp_path / "ckpt" / "run"
    store = open_storage(fake_gcs.url("ckpt"), timeout_s=10).child("run")
    with CheckpointUploader(store, keep_remote=2, keep_local=2) as uploader:
        trainer.step()
        uploader.submit(SaveRequest(trainer.snapshot(), run_dir / "step-00000001"))
        assert uploader.flush(timeout=bound(120))
        [result] = uploader.poll()
    assert result.ok and result.uploaded_to == f"{fake_gcs.url('ckpt')}/run/step-00000001"
    local = run_dir / "step-00000001"
    assert check_complete(local) is None
    blobs = {b.name.rsplit("/", 1)[1]: b for b in fake_gcs.client.list_blobs(fake_gcs.bucket, prefix="ckpt/run/")}
    assert set(blobs) == set(read_marker(local)["files"]) | {MARKER}
    for name, blob in blobs.items():
        assert fake_gcs.read(blob.name) == (local / name).read_bytes()
    # fake-gcs-server numbers generations by time: the marker is the last object written
    assert max(blobs.values(), key=lambda b: b.generation).name.endswith("/COMPLETE")


def test_second_upload_of_a_step_never_overwrites(trainer, tmp_path, fake_gcs, caplog):
    store = open_storage(fake_gcs.url(), timeout_s=10).child("run")
    trainer.step()
    with CheckpointUploader(store, background=False) as uploader:
        uploader.submit(SaveRequest(trainer.snapshot(), tmp_path / "a" / "step-00000001"))
    first = fake_gcs.read("run/step-00000001/__0_0.distcp")
    trainer.step()
    trainer.state.step = 1  # another attempt at step 1 with other weights
    with CheckpointUploader(store, background=False) as uploader:
        uploader.submit(SaveRequest(trainer.snapshot(), tmp_path / "b" / "step-00000001"))
        [result] = uploader.poll()
    assert result.ok and result.uploaded_to == f"{fake_gcs.url()}/run/step-00000001"
    assert (tmp_path / "b" / "step-00000001" / "__0_0.distcp").read_bytes() != first
    assert fake_gcs.read("run/step-00000001/__0_0.distcp") == first
    assert "already complete in the bucket and is kept as is (never overwritten)" in caplog.text


def test_keeps_last_n_remote_and_local_and_ignores_incomplete(trainer, tmp_path, bucket):
    run_dir = tmp_path / "ckpt" / "run"
    bucket.put("run/step-00000001/model.safetensors", b"an upload cut short, no marker")
    store = open_storage(bucket.url(), timeout_s=10).child("run")
    with CheckpointUploader(store, keep_remote=2, keep_local=3) as uploader:
        for _ in range(5):
            trainer.step()
            trainer.step()
            uploader.submit(SaveRequest(trainer.snapshot(), run_dir / step_dir_name(trainer.state.step)))
            assert uploader.flush(timeout=bound(120))
        assert all(r.ok for r in uploader.poll())
    steps = remote_steps(store)
    assert steps == {8: True, 10: True}  # older complete ones pruned, the partial one too (older than step 2)
    assert [s for s, _ in step_folders(run_dir)] == [6, 8, 10]
    assert latest_loads(store, tmp_path / "cache") == 10


def test_server_killed_during_upload_training_goes_on(trainer, tmp_path, emulator, caplog):
    run_dir = tmp_path / "ckpt" / "run"
    store = DiesDuringUpload(open_storage("gs://ckpt-bucket", timeout_s=TIMEOUT_S).child("run"), emulator.stop)
    uploader = CheckpointUploader(store, keep_remote=2, keep_local=5, max_failures=2)
    with uploader:
        trainer.step()
        uploader.submit(SaveRequest(trainer.snapshot(), run_dir / "step-00000001"))
        assert uploader.flush(timeout=bound(120)) and uploader.poll()[0].ok
        assert latest_loads(store, tmp_path / "cache") == 1

        store.arm(at=3)  # the server dies before the 3rd file of step 2
        trainer.step()
        uploader.submit(SaveRequest(trainer.snapshot(), run_dir / "step-00000002"))
        steps_while_uploading = 0
        while uploader.pending():
            trainer.step()  # the training thread is never blocked by the dead server
            steps_while_uploading += 1
        [failed] = uploader.poll()
        assert steps_while_uploading > 0
        assert not failed.ok and "upload failed" in failed.error and uploader.failures == 1 and uploader.fatal is None
        assert "step-00000002: upload failed" in caplog.text  # logged as an error on the training thread
        assert check_complete(run_dir / "step-00000002") is None  # the local checkpoint is whole

        emulator.start()
        assert remote_steps(store)[2] is False  # the cut upload left files, never a marker
        assert latest_loads(store, tmp_path / "cache") == 1
        trainer.state.step = 2
        trainer.step()
        uploader.submit(SaveRequest(trainer.snapshot(), run_dir / "step-00000003"))
        assert uploader.flush(timeout=bound(120))
        [ok] = uploader.poll()
    assert ok.ok and uploader.consecutive_failures == 0 and uploader.failures == 1
    assert latest_loads(store, tmp_path / "cache") == 3
    assert [p.name for p in (tmp_path / "cache").glob("step-*")] == ["step-00000003"]  # earlier downloads removed


def test_dead_server_backpressure_then_fatal(trainer, tmp_path, emulator, caplog, capsys):
    run_dir = tmp_path / "ckpt" / "run"
    store = open_storage("gs://ckpt-bucket", timeout_s=TIMEOUT_S).child("run")
    emulator.stop()
    uploader = CheckpointUploader(store, keep_remote=2, max_failures=3)
    with uploader:
        for _ in range(3):  # faster than the uploader can go: submit() waits rather than queue a third snapshot
            trainer.step()
            uploader.submit(SaveRequest(trainer.snapshot(), run_dir / step_dir_name(trainer.state.step)))
            assert uploader.pending() <= 2
        assert [r.step for r in uploader.poll()] == [1]  # the third got its slot only once the first was over
        assert uploader.flush(timeout=bound(120))
        assert "flush checkpoints" in capsys.readouterr().err  # the progress line
        results = uploader.poll()
    assert [r.step for r in results] == [2, 3] and all("upload failed" in r.error for r in results)
    assert all(check_complete(run_dir / step_dir_name(s)) is None for s in (1, 2, 3))  # all written
    assert uploader.consecutive_failures == 3
    assert uploader.fatal.startswith("3 checkpoint saves failed in a row (--max-upload-failures 3)")
    emulator.start()


def test_close_at_a_deadline_cancels_instead_of_waiting(trainer, tmp_path, emulator, caplog):
    store = open_storage("gs://ckpt-bucket", timeout_s=TIMEOUT_S).child("run")
    emulator.stop()
    uploader = CheckpointUploader(store)
    trainer.step()
    uploader.submit(SaveRequest(trainer.snapshot(), tmp_path / "step-00000001"))
    start = time.monotonic()
    assert uploader.close(timeout=0.2) is False
    assert time.monotonic() - start < bound(30)  # a hang bound only
    assert "was still saving when the time ran out" in caplog.text  # it cut the upload short, not waited for it
    thread = next(t for t in threading.enumerate() if t.name == "checkpoint-uploader")
    assert not thread.daemon  # an interpreter exit waits for it ...
    thread.join(timeout=bound(30))  # a hang bound: ... and it ends once its storage call gives up
    assert not thread.is_alive() and not uploader.poll()[0].ok
    emulator.start()


def test_synchronous_mode_and_bad_settings(trainer, tmp_path):
    bucket_dir = tmp_path / "bucket"
    uploader = CheckpointUploader(open_storage(str(bucket_dir)), background=False)
    trainer.step()
    uploader.submit(SaveRequest(trainer.snapshot(), tmp_path / "ckpt" / "step-00000001"))
    assert uploader.pending() == 0 and (bucket_dir / "step-00000001" / MARKER).is_file()  # done inside submit
    assert uploader.poll()[0].ok and uploader.close()
    with pytest.raises(PiconeoxError, match="keep_last=1: with --checkpoint-bucket keep at least 2"):
        CheckpointUploader(open_storage(str(bucket_dir)), keep_remote=1, background=False)
    with pytest.raises(PiconeoxError, match="--max-upload-failures 0: must be at least 1"):
        CheckpointUploader(None, max_failures=0, background=False)


@pytest.mark.parametrize("extra,message", [
    (["--grace-seconds", "0"], "--grace-seconds 0.0: must be a positive number of seconds"),
    (["--max-upload-failures", "0"], "--max-upload-failures 0: must be at least 1"),
    (["--checkpoint-bucket", "gs://Bad_Bucket!"], "bad bucket name 'Bad_Bucket!'"),
    (["--checkpoint-bucket", "BUCKET", "--keep-last", "1"], "keep_last=1: with --checkpoint-bucket keep at least 2"),
])
def test_bad_checkpoint_flags_are_one_line(tmp_path, tiny_data, capsys, extra, message):
    extra = [str(tmp_path / "bucket") if e == "BUCKET" else e for e in extra]
    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "2", *extra)
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and err.startswith("error: ") and "Traceback" not in err
    assert not (tmp_path / "bucket").exists()
