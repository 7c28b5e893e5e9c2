"""The checkpoint uploader against real GCS servers on 127.0.0.1, with real snapshots of a real model: the marker
last, no overwrite, rotation, synchronous mode and bad settings. A server that dies is test_uploader_dead_server.py.
"""

import pytest

from tests.support.bounds import bound
from tests.support.training import run
from tests.support.uploads import latest_loads
from utils.ckpt.bucket.remote import remote_steps
from utils.ckpt.format import MARKER, check_complete, read_marker, step_dir_name, step_folders
from utils.ckpt.uploader import CheckpointUploader, SaveRequest
from utils.errors import PiconeoxError
from utils.storage import open_storage

pytestmark = pytest.mark.usefixtures("fresh_accelerate_state", "logs_reach_caplog")


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
