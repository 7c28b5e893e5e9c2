"""One small storage interface for data and checkpoints: a local directory or a GCS bucket prefix.

    store = open_storage("gs://my-bucket/data/tiny")      # or "data/tiny", "file:///mnt/nfs/data/tiny"
    store.list()                  # {"train-0000.npy": ObjectInfo(...), "manifest.json": ...}, one listing
    store.get("manifest.json", Path("/tmp/manifest.json"))
    store.put(Path("ckpt/COMPLETE"), "step-100/COMPLETE", if_absent=True)

Both backends verify every byte they move with crc32c and never leave a half-written file under its
final name: downloads land in `<file>.partial` and are renamed only after the checksum matches.
GCS calls retry transient errors with backoff inside a bounded deadline (`timeout_s`), so a dead
server fails within that time instead of minutes per call.
"""
from __future__ import annotations

from pathlib import Path

from utils.errors import PiconeoxError
from utils.storage.base import (PARTIAL_SUFFIX, ObjectExists, ObjectInfo, Storage, StorageError, in_flight,
                                no_link_below, parse_gs_url, safe_relpath)
from utils.storage.local import LocalStorage

__all__ = ["PARTIAL_SUFFIX", "LocalStorage", "ObjectExists", "ObjectInfo", "Storage", "StorageError", "in_flight",
           "is_remote", "no_link_below", "open_storage", "parse_gs_url", "safe_relpath"]

REMOTE_SCHEMES = ("gs://",)  # object stores behind this interface; a new one (s3://) is one entry plus a backend


def is_remote(url: str | None) -> bool:
    """Whether `url` names a bucket (gs://...) rather than a local directory (plain or file://)."""
    return bool(url) and url.startswith(REMOTE_SCHEMES)


def open_storage(url: str, credentials: str | None = None, *, timeout_s: float = 60) -> Storage:
    """Open 'gs://bucket/prefix' (GCSStorage) or a local directory, plain or 'file://' (LocalStorage).

    credentials: a key file for gs:// URLs (ignored for local ones). timeout_s bounds each call,
    retries included.
    """
    if not timeout_s > 0:
        raise PiconeoxError(f"storage timeout must be a positive number of seconds, got {timeout_s}")
    if is_remote(url):
        bucket, prefix = parse_gs_url(url)
        from utils.storage.gcs import GCSStorage, resolve_credentials, storage

        creds, project = resolve_credentials(credentials)
        client = storage.Client(project=project, credentials=creds)
        return GCSStorage(client, bucket, prefix, timeout_s=timeout_s)
    path = url.removeprefix("file://")
    if not path or "://" in path:
        raise PiconeoxError(f"unsupported storage location {url!r}: use gs://bucket/prefix, file:///path or a "
                            "local path")
    check_local_bucket(path)
    return LocalStorage(path)


def check_local_bucket(path: str) -> None:
    """A local bucket is a folder (made on the first write): refuse a path that is a file or lies under one, before
    a run trains and then cannot upload."""
    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == Path(path).absolute() else f"lies under the file {existing}"
        raise PiconeoxError(f"bucket {path} {where}: a local bucket is a folder; choose another path")
