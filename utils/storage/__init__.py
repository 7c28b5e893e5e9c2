"""One small storage interface for data and checkpoints: a local directory or a bucket prefix (gs://, s3://).

    store = open_storage("gs://my-bucket/data/tiny")      # or "s3://...", "data/tiny", "file:///mnt/nfs/data/tiny"
    store.list()                  # {"train-0000.npy": ObjectInfo(...), "manifest.json": ...}, one listing
    store.get("manifest.json", Path("/tmp/manifest.json"))
    store.put(Path("ckpt/COMPLETE"), "step-100/COMPLETE", if_absent=True)

Every backend verifies every byte it moves with crc32c and never leaves a half-written file under its
final name: downloads land in `<file>.partial` and are renamed only after the checksum matches.
Remote calls retry transient errors with backoff inside a bounded deadline (`timeout_s`), so a dead
server fails within that time instead of minutes per call.

A location's scheme is read here and nowhere else (`is_remote`, `split_url`, `local_path`, `check_location`,
`cache_folder`, `check_credentials`): a bucket scheme is one entry in SCHEMES and one backend module, which offers
`open_bucket(bucket, prefix, credentials, timeout_s)` and `check_credentials(credentials)` and is imported only
when a URL of its scheme is used.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterable

from utils.errors import PiconeoxError
from utils.storage.base import (PARTIAL_SUFFIX, ObjectExists, ObjectInfo, Storage, StorageError, in_flight,
                                no_link_below, safe_relpath)
from utils.storage.local import LocalStorage

__all__ = ["PARTIAL_SUFFIX", "SCHEMES", "LocalStorage", "ObjectExists", "ObjectInfo", "Storage", "StorageError",
           "cache_folder", "check_credentials", "check_location", "in_flight", "is_remote", "local_path",
           "no_link_below", "open_storage", "safe_relpath", "split_url"]

LOCAL_SCHEME = "file://"


@dataclass(frozen=True)
class Scheme:
    """A bucket URL scheme: the bucket names it allows (`bucket`, and `rule` in words) and its backend module,
    imported by `backend()` on first use (each pulls in its cloud's client library)."""

    bucket: re.Pattern
    rule: str
    backend: Callable[[], ModuleType]


def _gcs() -> ModuleType:
    from utils.storage import gcs
    return gcs


def _s3() -> ModuleType:
    from utils.storage import s3
    return s3


SCHEMES = {
    "gs": Scheme(re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"), "3-222 lowercase letters, digits, '-', '_' or '.'",
                 _gcs),
    "s3": Scheme(re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]"), "3-63 lowercase letters, digits, '-' or '.'", _s3),
}
KEY_FILE_SCHEME = "gs"  # --credentials names a Google key file: checked whenever one is given


def _scheme(url: str | None) -> str | None:
    head, sep, _ = (url or "").partition("://")
    return head if sep and head in SCHEMES else None


def is_remote(url: str | None) -> bool:
    """Whether `url` names a bucket (gs://..., s3://...) rather than a local directory (plain or file://)."""
    return _scheme(url) is not None


def split_url(url: str) -> tuple[str, str, str]:
    """('gs', 'bucket', 'some/prefix') for 'gs://bucket/some/prefix', checking the bucket name and the prefix."""
    scheme = _scheme(url)
    if scheme is None:
        raise PiconeoxError(f"{url!r} is not a bucket URL: use {' or '.join(f'{s}://bucket/prefix' for s in SCHEMES)}")
    bucket, _, prefix = url[len(scheme) + 3:].partition("/")
    if not SCHEMES[scheme].bucket.fullmatch(bucket):
        raise PiconeoxError(f"bad bucket name {bucket!r} in {url!r}: expected {scheme}://bucket/prefix with a bucket "
                            f"of {SCHEMES[scheme].rule}")
    prefix = prefix.strip("/")
    if prefix:
        safe_relpath(prefix)
    return scheme, bucket, prefix


def local_path(url: str) -> str:
    """The folder a local location names: a plain path, or file:///path; refuses another or an unknown scheme."""
    path = url.removeprefix(LOCAL_SCHEME)
    if not path or "://" in path or is_remote(url):
        allowed = ", ".join(f"{s}://bucket/prefix" for s in SCHEMES)
        raise PiconeoxError(f"unsupported storage location {url!r}: use {allowed}, file:///path or a local path")
    return path


def check_location(url: str | None) -> None:
    """Refuse a malformed bucket URL or an unknown scheme (one line), reading nothing; None and paths pass."""
    if url:
        split_url(url) if is_remote(url) else local_path(url)


def cache_folder(root: str | Path, url: str) -> Path:
    """Where a copy of `url` is kept under `root`: root/<bucket>/<prefix> for gs://, root/<scheme>/<bucket>/<prefix>
    for other schemes (bucket names have at least 3 characters, so 's3' is never one), and for a local folder
    root/local/<its absolute path>."""
    if not is_remote(url):
        return Path(root, "local", *Path(local_path(url)).resolve().parts[1:])
    scheme, bucket, prefix = split_url(url)
    return Path(root, *([] if scheme == "gs" else [scheme]), bucket, *(prefix.split("/") if prefix else []))


def check_credentials(urls: Iterable[str | None], credentials: str | None = None) -> None:
    """Load the credentials each bucket scheme among `urls` needs (a key file given is checked too); reads no
    bucket. One line naming what is missing."""
    schemes = {_scheme(url) for url in urls if is_remote(url)} | ({KEY_FILE_SCHEME} if credentials else set())
    for scheme in sorted(schemes):
        SCHEMES[scheme].backend().check_credentials(credentials)


def open_storage(url: str, credentials: str | None = None, *, timeout_s: float = 60) -> Storage:
    """Open a bucket prefix ('gs://bucket/prefix', 's3://bucket/prefix') or a local directory, plain or 'file://'
    (LocalStorage).

    credentials: a key file for gs:// URLs (S3 reads the AWS variables and profiles). timeout_s bounds each call,
    retries included.
    """
    if not timeout_s > 0:
        raise PiconeoxError(f"storage timeout must be a positive number of seconds, got {timeout_s}")
    if is_remote(url):
        scheme, bucket, prefix = split_url(url)
        return SCHEMES[scheme].backend().open_bucket(bucket, prefix, credentials, timeout_s)
    path = local_path(url)
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
