"""utils/storage/s3.py against moto's S3 server on 127.0.0.1: checksums kept and checked, damaged objects refused,
bad input one line. (The protocol shared with gs:// and local folders runs on all three in tests/gcs.)"""
import os
import socket

import google_crc32c
import pytest

from tests.support.s3_servers import SECRET
from utils.crc import crc32c_b64
from utils.errors import PiconeoxError
from utils.storage import ObjectExists, StorageError, check_credentials, open_storage
from utils.storage.sync import download_tree, upload_tree


def text(shared_data, size: int) -> bytes:
    """`size` bytes of real text, repeated as needed."""
    corpus = b"".join(p.read_bytes() for p in sorted(shared_data.rglob("*.txt")))
    return (corpus * (size // len(corpus) + 1))[:size]


def test_every_object_carries_its_crc32c_and_a_multipart_upload_is_checked_whole(s3_server, shared_data, tmp_path):
    store = open_storage(s3_server.url("ckpt"), timeout_s=10)
    small, big = tmp_path / "small.bin", tmp_path / "big.bin"
    small.write_bytes(text(shared_data, 100_000))
    big.write_bytes(text(shared_data, 11 << 20))
    store.part_size = 5 << 20  # S3's smallest part: the 11 MiB file goes up in three
    for path in (small, big):
        info = store.put(path, path.name)
        assert info.crc32c == google_crc32c.value(path.read_bytes()) and info.size == path.stat().st_size
        assert s3_server.metadata(f"ckpt/{path.name}") == {"crc32c": crc32c_b64(info.crc32c)}
    listed = store.list()
    assert {n: (i.size, i.crc32c) for n, i in listed.items()} == {
        p.name: (p.stat().st_size, google_crc32c.value(p.read_bytes())) for p in (small, big)}
    assert store.get("big.bin", tmp_path / "back.bin").crc32c == listed["big.bin"].crc32c
    assert (tmp_path / "back.bin").read_bytes() == big.read_bytes()


def test_if_absent_never_overwrites_a_marker_or_a_large_file(s3_server, tmp_path):
    store = open_storage(s3_server.url("ckpt"), timeout_s=10)
    store.put_bytes(b"first", "step-1/COMPLETE", if_absent=True)
    with pytest.raises(ObjectExists, match="step-1/COMPLETE"):
        store.put_bytes(b"second", "step-1/COMPLETE", if_absent=True)
    store.part_size = 5 << 20
    (tmp_path / "big").write_bytes(os.urandom(6 << 20))
    store.put(tmp_path / "big", "step-1/big", if_absent=True)
    with pytest.raises(ObjectExists):
        store.put(tmp_path / "big", "step-1/big", if_absent=True)
    assert s3_server.read("ckpt/step-1/COMPLETE") == b"first"


@pytest.mark.parametrize("damage", ["same-size", "truncated"])
def test_a_damaged_object_is_refused_and_nothing_is_kept(s3_server, shared_data, tmp_path, damage):
    """Bytes replaced behind our back under the old crc32c (a bad disk, another writer): the download is refused,
    leaving neither the file nor a .partial, and a sync counts it failed."""
    good = text(shared_data, 200_000)
    store = open_storage(s3_server.url("d"), timeout_s=10)
    (tmp_path / "f").write_bytes(good)
    store.put(tmp_path / "f", "shard.bin")
    bad = good[:100_000] if damage == "truncated" else bytes([good[0] ^ 1]) + good[1:]
    s3_server.put_unchecked("d/shard.bin", bad, s3_server.metadata("d/shard.bin"))
    with pytest.raises(StorageError, match="crc32c mismatch"):
        store.get("shard.bin", tmp_path / "back")
    assert not (tmp_path / "back").exists() and not (tmp_path / "back.partial").exists()
    summary = download_tree(store, tmp_path / "dest", progress=False)
    assert summary.failed == 1 and not list((tmp_path / "dest").glob("shard.bin*"))


def test_an_object_without_a_crc32c_is_never_trusted(s3_server, tmp_path):
    s3_server.put_unchecked("d/other-tool.bin", b"uploaded by another tool")
    s3_server.put("d/checked.bin", b"uploaded with S3's own CRC32C")
    store = open_storage(s3_server.url("d"), timeout_s=10)
    listed = store.list()
    assert listed["other-tool.bin"].crc32c is None
    assert listed["checked.bin"].crc32c == google_crc32c.value(b"uploaded with S3's own CRC32C")
    with pytest.raises(StorageError, match="has no crc32c, so the download cannot be verified"):
        store.get("other-tool.bin", tmp_path / "x")
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "other-tool.bin").write_bytes(b"uploaded by another tool")  # same bytes: still not skipped
    summary = download_tree(store, tmp_path / "dest", progress=False)
    assert (summary.downloaded, summary.skipped, summary.failed) == (1, 0, 1)


def test_push_skips_only_what_the_bucket_holds_with_the_same_size_and_crc32c(s3_server, tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    for i in range(3):
        (ds / f"train-{i}.npy").write_bytes(bytes([i]) * 5000)
    (ds / "manifest.json").write_text("{}")
    store = open_storage(s3_server.url("data/ds"), timeout_s=10)
    assert upload_tree(ds, store, progress=False).downloaded == 4
    again = upload_tree(ds, store, progress=False)
    assert (again.downloaded, again.skipped) == (0, 4)
    (ds / "train-1.npy").write_bytes(b"\x07" * 5000)  # same size, other bytes
    changed = upload_tree(ds, store, progress=False)
    assert (changed.downloaded, changed.skipped) == (2, 2)  # the file, then the manifest put back last
    assert s3_server.read("data/ds/train-1.npy") == b"\x07" * 5000


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_input_is_one_line_without_the_secret(s3_server, tmp_path, monkeypatch):
    messages = []

    def refused(call, match):
        with pytest.raises(PiconeoxError, match=match) as e:
            call()
        messages.append(str(e.value))

    refused(lambda: open_storage("s3://Bad_Bucket/data"), "bad bucket name 'Bad_Bucket'.*3-63 lowercase")
    refused(lambda: open_storage("s3://ab/data"), "bad bucket name 'ab'")
    refused(lambda: open_storage("s4://bucket/data"), "unsupported storage location 's4://bucket/data'")
    refused(lambda: open_storage("s3://no-such-bucket/data", timeout_s=5).list(),
            "check that bucket 'no-such-bucket' exists")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    refused(lambda: open_storage(s3_server.url("d"), timeout_s=2).list(), "EndpointConnectionError")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    refused(lambda: open_storage(s3_server.url("d")), "no AWS credentials found for s3://.*AWS_ACCESS_KEY_ID")
    refused(lambda: check_credentials(["data/local", s3_server.url("d")]), "no AWS credentials found")
    check_credentials(["data/local", None, "file:///tmp/x"])  # no bucket: nothing to check
    assert all("\n" not in m and SECRET not in m for m in messages), messages
