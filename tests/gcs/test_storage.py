"""utils/storage/ against real servers on 127.0.0.1 and a local directory, through the official client."""
import json
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import google_crc32c
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.bounds import bound
from utils.errors import PiconeoxError
from utils.storage import ObjectExists, StorageError, open_storage, safe_relpath
from utils.storage.gcs import UPLOAD_CHUNK_SIZE


@pytest.mark.parametrize("name", ["a.npy", "train/shard-0001.npy", "x..y/z", "dir.v2/.hidden"])
def test_safe_relpath_accepts_plain_relative_names(name):
    assert safe_relpath(name) == name


@pytest.mark.parametrize("name", ["", "..", "../etc/passwd", "a/../../b", "./a", "/etc/passwd",
                                  "evil//tmp/x", "a/", "a\\..\\b", "a\x00b"])
def test_safe_relpath_refuses_names_that_could_escape(name):
    with pytest.raises(PiconeoxError, match="refusing object name"):
        safe_relpath(name)


def test_backends_share_semantics(bucket, text_tree, tmp_path):
    """Put, list, get, exists, child and delete behave the same on gs:// and on a local directory."""
    store = open_storage(bucket.url("data/tiny"), timeout_s=5)
    src = tmp_path / "upload.txt"
    src.write_bytes(text_tree["tinyshakespeare/input.txt"])

    put = store.put(src, "text/input.txt")
    marker = store.put_bytes(b"{}", "manifest.json")
    listing = store.list()
    assert set(listing) == {"text/input.txt", "manifest.json"}
    assert listing["text/input.txt"].size == src.stat().st_size == put.size
    assert listing["text/input.txt"].crc32c == google_crc32c.value(src.read_bytes()) == put.crc32c
    assert listing["manifest.json"].crc32c == marker.crc32c == google_crc32c.value(b"{}")
    assert set(store.list("text/")) == {"text/input.txt"}
    assert bucket.read("data/tiny/text/input.txt") == src.read_bytes()

    got = store.get("text/input.txt", tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_bytes() == src.read_bytes() and got.crc32c == put.crc32c
    assert not (tmp_path / "back.txt.partial").exists()

    sub = store.child("text")
    assert sub.url.endswith("data/tiny/text") and set(sub.list()) == {"input.txt"}
    assert store.exists("manifest.json") and not store.exists("nothing.here")
    store.delete("manifest.json")
    store.delete("manifest.json")  # deleting what is gone is fine
    assert set(store.list()) == {"text/input.txt"}
    with pytest.raises(StorageError):
        store.get("nothing.here", tmp_path / "x")
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()


def test_names_are_guarded_on_every_backend(bucket, tmp_path):
    store = open_storage(bucket.url("root"), timeout_s=5)
    for bad in ["../outside", "/abs", "a//b"]:
        with pytest.raises(PiconeoxError, match="refusing object name"):
            store.put_bytes(b"x", bad)
    assert not (tmp_path / "outside").exists()


@pytest.mark.parametrize("backend", ["gcs", "local"])
def test_if_absent_never_overwrites(backend, request, tmp_path):
    """fake-gcs-server enforces if_generation_match=0 like real GCS; a local directory does the same."""
    url = request.getfixturevalue("fake_gcs").url("ckpt") if backend == "gcs" else str(tmp_path / "ckpt")
    store = open_storage(url, timeout_s=5)
    store.put_bytes(b"first", "step-1/COMPLETE", if_absent=True)
    with pytest.raises(ObjectExists, match="step-1/COMPLETE"):
        store.put_bytes(b"second", "step-1/COMPLETE", if_absent=True)
    (tmp_path / "f").write_bytes(b"third")
    with pytest.raises(ObjectExists):
        store.put(tmp_path / "f", "step-1/COMPLETE", if_absent=True)
    store.get("step-1/COMPLETE", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"first"
    store.put(tmp_path / "f", "step-1/COMPLETE")  # without if_absent an overwrite is allowed
    assert store.get("step-1/COMPLETE", tmp_path / "out").size == 5


def test_large_file_goes_up_in_resumable_chunks(gcs_emulator, tmp_path):
    """A file above the multipart limit takes the resumable path in UPLOAD_CHUNK_SIZE chunks, checked end to end."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(UPLOAD_CHUNK_SIZE + 123_457))
    store = open_storage(gcs_emulator.url("big"), timeout_s=10)
    info = store.put(big, "big.bin")
    assert info.size == big.stat().st_size and info.crc32c == google_crc32c.value(big.read_bytes())
    store.get("big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()


def test_listing_follows_pages(fake_gcs):
    """fake-gcs-server pages at 1,000 objects; the listing must return all of them."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: fake_gcs.put(f"p/{i:04d}.txt", str(i).encode()), range(1005)))
    listing = open_storage(fake_gcs.url("p"), timeout_s=5).list()
    assert len(listing) == 1005 and listing["1004.txt"].size == 4


def test_missing_bucket_is_a_clear_error(gcs_emulator):
    store = open_storage("gs://no-such-bucket/data", timeout_s=5)
    with pytest.raises(StorageError, match="not found.*no-such-bucket"):
        store.list()


def test_dead_server_fails_within_the_deadline(monkeypatch, unused_tcp_port):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{unused_tcp_port}")
    store = open_storage("gs://some-bucket/data", timeout_s=1.5)
    start = time.monotonic()
    with pytest.raises(StorageError, match="list gs://some-bucket/data"):
        store.list()
    assert time.monotonic() - start < min(bound(30), 100)  # a hang bound, below the client's own retry deadline (120 s)


@pytest.fixture
def unused_tcp_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("url", ["s4://bucket/x", "s3://Bad_Bucket/x", "s3://ab", "gs://", "gs://Bad_Bucket/x", "gs://b/x",
                                 "gs://bucket/a/../b", ""])
def test_bad_urls_are_refused(url):
    with pytest.raises(PiconeoxError):
        open_storage(url)


def test_bad_timeout_is_refused():
    with pytest.raises(PiconeoxError, match="timeout"):
        open_storage("data/x", timeout_s=0)


# ---- credentials -------------------------------------------------------------------------------

SECRET = "DO-NOT-PRINT-ME-0123456789"


def service_account_key() -> dict:
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return {
        "type": "service_account", "project_id": "piconeox-test", "private_key_id": SECRET,
        "private_key": pem.decode(), "client_email": "trainer@piconeox-test.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token",
    }


@pytest.mark.parametrize("content", [
    f"not json {SECRET}",
    json.dumps({"note": SECRET}),
    json.dumps({**service_account_key(), "private_key": f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n"}),
    json.dumps({"type": "external_account", "credential_source": {"executable": {"command": SECRET}}}),
], ids=["not-json", "no-type", "bad-private-key", "external-account"])
def test_malformed_key_names_the_file_never_its_content(gcs_emulator, tmp_path, content):
    key = tmp_path / "key.json"
    key.write_text(content)
    key.chmod(0o600)
    with pytest.raises(PiconeoxError) as err:
        open_storage(gcs_emulator.url("data"), str(key))
    assert str(key) in str(err.value) and SECRET not in str(err.value)


def test_missing_and_unreadable_keys(gcs_emulator, tmp_path, monkeypatch):
    with pytest.raises(PiconeoxError, match=r"missing\.json \(from --credentials\) does not exist"):
        open_storage(gcs_emulator.url(), str(tmp_path / "missing.json"))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "env.json"))
    with pytest.raises(PiconeoxError, match="env.json .from GOOGLE_APPLICATION_CREDENTIALS. does not exist"):
        open_storage(gcs_emulator.url())
    if os.geteuid() != 0:  # root reads any file
        key = tmp_path / "locked.json"
        key.write_text("{}")
        key.chmod(0)
        with pytest.raises(PiconeoxError, match="locked.json .* cannot be read"):
            open_storage(gcs_emulator.url(), str(key))


def test_key_readable_by_others_warns_but_works(gcs_emulator, tmp_path, caplog):
    key = tmp_path / "key.json"
    key.write_text(json.dumps(service_account_key()))
    key.chmod(0o600)
    gcs_emulator.put("data/a.txt", b"a")
    with caplog.at_level(logging.WARNING):
        assert set(open_storage(gcs_emulator.url("data"), str(key)).list()) == {"a.txt"}
    assert not caplog.records
    key.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        open_storage(gcs_emulator.url("data"), str(key))
    assert "readable by other users" in caplog.text and "chmod 600" in caplog.text
    assert SECRET not in caplog.text


def test_no_credentials_is_a_clear_error_without_network(tmp_path, monkeypatch):
    for var in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud application-default login here
    tried = []  # without network: no connection is even tried (a metadata-server probe would be one)
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: tried.append(address))
    monkeypatch.setattr(socket.socket, "connect_ex", lambda self, address: tried.append(address))
    with pytest.raises(PiconeoxError, match="no Google Cloud credentials found.*--credentials"):
        open_storage("gs://some-bucket/data")
    assert tried == []


def test_the_key_mode_warning_comes_once_not_again_in_the_launched_run(gcs_emulator, tmp_path, caplog, monkeypatch):
    """The preflight warns; later opens in that process and the run start_training.sh launches
    after it (PICONEOX_PREFLIGHT_PASSED) do not repeat it."""
    import utils.storage.gcs as storage_module

    key = tmp_path / "key.json"
    key.write_text(json.dumps(service_account_key()))
    key.chmod(0o644)
    monkeypatch.setattr(storage_module, "_mode_warned", set())
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # e.g. the --data sync, the --checkpoint-bucket and a gs:// --resume
            open_storage(gcs_emulator.url("data"), str(key))
    assert caplog.text.count("readable by other users") == 1
    caplog.clear()
    monkeypatch.setattr(storage_module, "_mode_warned", set())
    monkeypatch.setenv("PICONEOX_PREFLIGHT_PASSED", "1")
    with caplog.at_level(logging.WARNING):
        open_storage(gcs_emulator.url("data"), str(key))
    assert "readable by other users" not in caplog.text
    from tests.support.paths import REPO

    assert "PICONEOX_PREFLIGHT_PASSED=1" in (REPO / "start_training.sh").read_text()
