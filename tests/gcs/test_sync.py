"""utils/storage/sync.py: verified download/upload of real text trees against real servers and local directories."""
import json
import os
import socket
from pathlib import Path

import pytest

from tests.support.gcs_servers import CuttingRelay, start_fake_gcs, use_server
from utils.data.source import ensure_local
from utils.run.allocation import machine_folder
from utils.errors import PiconeoxError
from utils.storage import open_storage
from utils.storage.sync import INDEX_NAME, download_tree, upload_tree


def seed(bucket, prefix: str, tree: dict[str, bytes]) -> None:
    for name, data in tree.items():
        bucket.put(f"{prefix}/{name}", data)


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()
            and p.name != INDEX_NAME}


def test_nested_download_then_rerun_transfers_nothing(bucket, text_tree, tmp_path):
    seed(bucket, "data/text", text_tree)
    src = open_storage(bucket.url("data/text"), timeout_s=5)
    first = download_tree(src, tmp_path / "dest", progress=False)
    assert (first.downloaded, first.skipped, first.failed) == (len(text_tree), 0, 0)
    assert first.bytes == sum(map(len, text_tree.values()))
    assert files_under(tmp_path / "dest") == text_tree

    again = download_tree(src, tmp_path / "dest", progress=False)
    assert (again.downloaded, again.skipped, again.failed, again.bytes) == (0, len(text_tree), 0, 0)


def test_truncated_and_same_size_corrupted_files_are_fetched_again(bucket, text_tree, tmp_path):
    seed(bucket, "d", text_tree)
    src, dest = open_storage(bucket.url("d"), timeout_s=5), tmp_path / "dest"
    download_tree(src, dest, progress=False)
    truncated, corrupted, *_ = sorted(text_tree)
    (dest / truncated).write_bytes(text_tree[truncated][:1000])  # a download cut off by Ctrl-C
    flipped = bytearray(text_tree[corrupted])
    flipped[len(flipped) // 2] ^= 0x01
    (dest / corrupted).write_bytes(bytes(flipped))  # same size, one bit off

    summary = download_tree(src, dest, progress=False)
    assert (summary.downloaded, summary.skipped) == (2, len(text_tree) - 2)
    assert files_under(dest) == text_tree


def test_crc_index_trusts_unchanged_size_and_mtime_and_can_be_reset(gcs_emulator, text_tree, tmp_path):
    """Re-runs reuse the index instead of re-hashing: a rewrite that keeps size and mtime goes unseen
    until the index is deleted (documented, like rsync's quick check)."""
    seed(gcs_emulator, "d", text_tree)
    src, dest = open_storage(gcs_emulator.url("d"), timeout_s=5), tmp_path / "dest"
    download_tree(src, dest, progress=False)
    name = sorted(text_tree)[0]
    st = (dest / name).stat()
    (dest / name).write_bytes(b"x" * st.st_size)
    os.utime(dest / name, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert download_tree(src, dest, progress=False).downloaded == 0
    (dest / INDEX_NAME).unlink()
    assert download_tree(src, dest, progress=False).downloaded == 1
    assert (dest / name).read_bytes() == text_tree[name]


def test_stale_partials_are_removed_and_never_trusted(bucket, text_tree, tmp_path):
    seed(bucket, "d", text_tree)
    name = sorted(text_tree)[0]
    stale = tmp_path / "dest" / f"{name}.partial"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(text_tree[name])  # complete bytes, but never verified: must not be used
    summary = download_tree(open_storage(bucket.url("d"), timeout_s=5), tmp_path / "dest", progress=False)
    assert summary.downloaded == len(text_tree)
    assert not list((tmp_path / "dest").rglob("*.partial"))


def test_include_dry_run_and_empty_source(bucket, text_tree, tmp_path):
    seed(bucket, "d", text_tree)
    src = open_storage(bucket.url("d"), timeout_s=5)
    plan = download_tree(src, tmp_path / "dest", include="tinystories/*", dry_run=True, progress=False)
    wanted = {n: d for n, d in text_tree.items() if n.startswith("tinystories/")}
    assert (plan.downloaded, plan.bytes) == (len(wanted), sum(map(len, wanted.values())))
    assert not (tmp_path / "dest").exists()
    download_tree(src, tmp_path / "dest", include="tinystories/*", progress=False)
    assert files_under(tmp_path / "dest") == wanted
    with pytest.raises(PiconeoxError, match="matches none"):
        download_tree(src, tmp_path / "dest", include="*.parquet", progress=False)
    with pytest.raises(PiconeoxError, match="no objects under"):
        download_tree(open_storage(bucket.url("nothing"), timeout_s=5), tmp_path / "x", progress=False)


def test_names_escaping_dest_are_refused_end_to_end(gcs_emulator, tmp_path):
    """Both servers keep '//' and leading-slash names; a naive join would write outside dest."""
    outside = tmp_path / "outside" / "pwned"
    gcs_emulator.put("ok.txt", b"fine")
    gcs_emulator.put(f"/{outside}", b"evil")
    gcs_emulator.put(f"evil/{outside}", b"evil")  # evil//tmp/...
    summary = download_tree(open_storage(gcs_emulator.url(), timeout_s=5), tmp_path / "dest", progress=False)
    assert (summary.downloaded, summary.failed) == (1, 2)
    assert all("refusing object name" in e for e in summary.errors)
    assert not outside.exists() and files_under(tmp_path / "dest") == {"ok.txt": b"fine"}


def test_server_killed_mid_download_leaves_no_file_and_rerun_completes(shared_data, tmp_path, monkeypatch, fake_gcs):
    big = b"".join(p.read_bytes() for p in sorted(shared_data.rglob("*.txt")))  # ~5.7 MB of real text
    first = start_fake_gcs()
    try:
        use_server(first.url, monkeypatch, "kill-test").put("data/big.txt", big)
        relay = CuttingRelay(first.port, cut_after=1 << 20, on_cut=first._process.kill)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", relay.host)
        src = open_storage("gs://kill-test/data", timeout_s=2)
        summary = download_tree(src, tmp_path / "dest", workers=1, progress=False)
        assert summary.failed == 1 and "big.txt" in summary.errors[0]
        assert not (tmp_path / "dest" / "big.txt").exists() and not list((tmp_path / "dest").rglob("*.partial"))
        assert first._process.poll() is not None  # the server really died
    finally:
        first.stop()

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.host)  # the rerun, on the session's live server
    fake_gcs.put("data/big.txt", big)
    summary = download_tree(open_storage(fake_gcs.url("data"), timeout_s=5), tmp_path / "dest", progress=False)
    assert (summary.downloaded, summary.failed) == (1, 0)
    assert (tmp_path / "dest" / "big.txt").read_bytes() == big


def make_dataset(root: Path, text_tree: dict[str, bytes]) -> dict[str, bytes]:
    files = {**text_tree, "manifest.json": json.dumps({"files": sorted(text_tree)}).encode()}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def test_push_uploads_manifest_last_and_rerun_skips(fake_gcs, text_tree, tmp_path):
    files = make_dataset(tmp_path / "ds", text_tree)
    dst = open_storage(fake_gcs.url("data/ds"), timeout_s=5)
    summary = upload_tree(tmp_path / "ds", dst, progress=False)
    assert (summary.downloaded, summary.failed) == (len(files), 0)
    remote = dst.list()
    assert {n: fake_gcs.read(f"data/ds/{n}") for n in remote} == files
    assert remote["manifest.json"].generation > max(i.generation for n, i in remote.items() if n != "manifest.json")

    changed = sorted(text_tree)[0]
    (tmp_path / "ds" / changed).write_bytes(b"changed")
    again = upload_tree(tmp_path / "ds", dst, progress=False)
    # Only the changed file goes up, then the manifest again: it was withdrawn while the folder changed.
    assert (again.downloaded, again.skipped) == (2, len(files) - 2)
    remote = dst.list()
    assert fake_gcs.read(f"data/ds/{changed}") == b"changed"
    assert remote["manifest.json"].generation > remote[changed].generation
    assert upload_tree(tmp_path / "ds", dst, progress=False).skipped == len(files)


def test_push_failure_keeps_the_remote_folder_incomplete(fake_gcs, text_tree, tmp_path):
    files = make_dataset(tmp_path / "ds", text_tree)
    victim = sorted(text_tree)[0]
    fake_gcs.put(f"data/ds/{victim}", b"someone else's bytes")
    dst = open_storage(fake_gcs.url("data/ds"), timeout_s=5)
    summary = upload_tree(tmp_path / "ds", dst, if_absent=True, progress=False)
    assert summary.failed == 1 and "already exists" in summary.errors[0]
    assert set(dst.list()) == set(files) - {"manifest.json"}


def test_push_requires_the_manifest(bucket, text_tree, tmp_path):
    for name, data in text_tree.items():
        (tmp_path / "ds" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ds" / name).write_bytes(data)
    with pytest.raises(PiconeoxError, match="has no manifest.json"):
        upload_tree(tmp_path / "ds", open_storage(bucket.url("x")), progress=False)


def test_push_then_download_roundtrip_between_backends(bucket, text_tree, tmp_path):
    files = make_dataset(tmp_path / "ds", text_tree)
    upload_tree(tmp_path / "ds", open_storage(bucket.url("data/ds"), timeout_s=5), progress=False)
    download_tree(open_storage(bucket.url("data/ds"), timeout_s=5), tmp_path / "back", progress=False)
    assert files_under(tmp_path / "back") == files


def test_ensure_local_caches_gs_and_passes_local_paths(gcs_emulator, text_tree, tmp_path):
    seed(gcs_emulator, "data/ds", text_tree)
    path = ensure_local(gcs_emulator.url("data/ds"), machine_folder(tmp_path / "cache"))
    assert path == tmp_path / "cache" / socket.gethostname() / gcs_emulator.bucket / "data" / "ds"
    assert files_under(path) == text_tree
    assert ensure_local("data/ds", tmp_path / "cache") == Path("data/ds")
    assert ensure_local("file:///mnt/data/ds", tmp_path / "cache") == Path("/mnt/data/ds")


def test_machines_sharing_a_filesystem_keep_each_others_downloads(gcs_emulator, text_tree, tmp_path, monkeypatch):
    """Two machines sync into one shared cache root: B's stale-.partial cleanup must not delete A's download."""
    seed(gcs_emulator, "data/ds", text_tree)
    monkeypatch.setattr(socket, "gethostname", lambda: "machine-a")
    a = ensure_local(gcs_emulator.url("data/ds"), machine_folder(tmp_path / "cache"))
    in_flight = a / "train-0001.npy.partial"  # machine A is downloading this right now
    in_flight.write_bytes(b"half of a shard")
    monkeypatch.setattr(socket, "gethostname", lambda: "machine-b")
    b = ensure_local(gcs_emulator.url("data/ds"), machine_folder(tmp_path / "cache"))
    assert in_flight.read_bytes() == b"half of a shard"
    assert a.parent.parent.parent.name == "machine-a" and b != a and files_under(b) == text_tree
