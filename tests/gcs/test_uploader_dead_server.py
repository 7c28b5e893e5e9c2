"""The checkpoint uploader while its GCS server dies and comes back: training goes on, a dead server pushes back
and then ends the run, a close at a deadline cancels instead of waiting.

A server that dies (and comes back) is gcp-storage-emulator on a fixed port with its objects on disk:
stopping it closes the port, restarting it on the same port serves the same objects.
"""
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.uploads import latest_loads
from utils.ckpt.bucket.remote import remote_steps
from utils.ckpt.format import check_complete, step_dir_name
from utils.ckpt.uploader import CheckpointUploader, SaveRequest
from utils.storage import Storage, open_storage

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state", "logs_reach_caplog")

TIMEOUT_S = 2.0  # per storage call, retries included: a dead server fails an upload in ~2 s


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
