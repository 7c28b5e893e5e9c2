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

import contextlib
import json
import logging
import os
import re
import stat
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Iterator

import google_crc32c

from utils.crc import CHUNK, crc32c_b64, crc32c_file, crc32c_from_b64
from utils.errors import PiconeoxError

# The Google client libraries are imported where a gs:// location is used, never at import time: a run with
# local data and checkpoints works on a box that has none of them (a lent GPU machine without network).
if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import storage

log = logging.getLogger(__name__)

SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write"]
UPLOAD_CHUNK_SIZE = 8 << 20  # resumable uploads send 8 MiB chunks (a multiple of 256 KiB, as GCS requires)
PARTIAL_SUFFIX = ".partial"
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


class StorageError(PiconeoxError):
    """A storage operation failed: missing bucket or object, no access, server unreachable, bad checksum."""


class ObjectExists(StorageError):
    """`put(..., if_absent=True)` found the object already there (GCS precondition 412)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object as a listing reports it.

    name: path relative to the storage root, '/'-separated.
    size: bytes.
    crc32c: CRC32C of the content, or None when the backend was asked not to compute it.
    generation: GCS object generation (changes on every overwrite); None for local files.
    """

    name: str
    size: int
    crc32c: int | None
    generation: int | None


def safe_relpath(name: str) -> str:
    """Return `name` if it is a safe relative object path, else raise PiconeoxError.

    This is the traversal guard: a name joined onto a destination directory must stay inside it.
    Refused: empty names, absolute names, '..' or '.' segments, empty segments ('a//b', 'a/'),
    backslashes and NUL bytes.
    """
    reason = None
    if not name:
        reason = "it is empty"
    elif "\x00" in name:
        reason = "it contains a NUL byte"
    elif "\\" in name:
        reason = "it contains a backslash"
    elif name.startswith("/"):
        reason = "it is absolute"
    elif any(part in ("", ".", "..") for part in name.split("/")):
        reason = "it has an empty, '.' or '..' segment"
    if reason:
        raise PiconeoxError(
            f"refusing object name {name!r}: {reason}; allowed are relative '/'-separated paths "
            "without '..', '.', empty segments, backslashes or NUL"
        )
    return name


class Storage(ABC):
    """A flat namespace of objects under a root (a local directory or a gs:// bucket prefix)."""

    url: str

    @abstractmethod
    def list(self, prefix: str = "", *, checksums: bool = True) -> dict[str, ObjectInfo]:
        """All objects whose relative name starts with `prefix`, recursively, in one listing.

        checksums=False lets a backend that must read the bytes to know a crc32c (local) skip that
        work and report crc32c=None; GCS always has it.
        """

    @abstractmethod
    def get(self, name: str, local_path: Path) -> ObjectInfo:
        """Download `name` to `local_path` via `<local_path>.partial`, verify crc32c, rename into place."""

    @abstractmethod
    def put(self, local_path: Path, name: str, *, if_absent: bool = False) -> ObjectInfo:
        """Upload a file and verify the stored crc32c; with if_absent raise ObjectExists instead of overwriting."""

    @abstractmethod
    def put_bytes(self, data: bytes, name: str, *, if_absent: bool = False) -> ObjectInfo:
        """Store a small object (a COMPLETE marker, a manifest) from memory."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove an object; a missing object is not an error."""

    @abstractmethod
    def exists(self, name: str) -> bool:
        """Whether the object exists."""

    @abstractmethod
    def child(self, sub: str) -> Storage:
        """The same backend rooted one or more folders deeper."""


def in_flight(filename: str) -> bool:
    """Whether a local file name is a download (`.partial`) or atomic write (`.name.xxx.tmp`) still
    under way: such files are not objects yet."""
    return filename.endswith(PARTIAL_SUFFIX) or (filename.startswith(".") and filename.endswith(".tmp"))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


class LocalStorage(Storage):
    """A directory used as a bucket: same names, checksums and atomicity as GCS, no account needed."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, name: str) -> Path:
        return self.root / safe_relpath(name)

    def list(self, prefix: str = "", *, checksums: bool = True) -> dict[str, ObjectInfo]:
        found = {}
        folder, _, _ = prefix.rpartition("/")
        for dirpath, _dirs, files in os.walk(self._path(folder) if folder else self.root):
            for file in files:
                if in_flight(file):
                    continue
                path = Path(dirpath, file)
                name = path.relative_to(self.root).as_posix()
                if name.startswith(prefix):
                    crc = crc32c_file(path) if checksums else None
                    found[name] = ObjectInfo(name, path.stat().st_size, crc, None)
        return found

    def get(self, name: str, local_path: Path) -> ObjectInfo:
        source = self._path(name)
        if not source.is_file():
            raise StorageError(f"get {self.url}/{name}: no such file")
        partial = Path(f"{local_path}{PARTIAL_SUFFIX}")
        try:
            with open(source, "rb") as src, open(partial, "wb") as dst:
                crc = _copy_with_crc(src, dst)
            _verify_file(partial, crc, f"{self.url}/{name}")
            os.replace(partial, local_path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return ObjectInfo(name, Path(local_path).stat().st_size, crc, None)

    def put(self, local_path: Path, name: str, *, if_absent: bool = False) -> ObjectInfo:
        with open(local_path, "rb") as src:
            crc = self._publish(name, lambda dst: _copy_with_crc(src, dst), if_absent)
        return ObjectInfo(name, Path(local_path).stat().st_size, crc, None)

    def put_bytes(self, data: bytes, name: str, *, if_absent: bool = False) -> ObjectInfo:
        def write(dst: IO[bytes]) -> int:
            dst.write(data)
            return google_crc32c.value(data)

        return ObjectInfo(name, len(data), self._publish(name, write, if_absent), None)

    def _publish(self, name: str, write: Callable[[IO[bytes]], int], if_absent: bool) -> int:
        """Write to a temp file beside the target, check it, then rename (or hard-link, for if_absent:
        link() fails if the target exists, which makes "create only if absent" atomic)."""
        dest = self._path(name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                crc = write(f)
            _verify_file(Path(tmp), crc, f"{self.url}/{name}")
            if if_absent:
                try:
                    os.link(tmp, dest)
                except FileExistsError:
                    raise ObjectExists(f"put {self.url}/{name}: object already exists") from None
            else:
                os.replace(tmp, dest)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return crc

    def delete(self, name: str) -> None:
        path = self._path(name)
        path.unlink(missing_ok=True)
        # Drop folders left empty, like GCS, where a folder exists only through its objects.
        for parent in path.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            with contextlib.suppress(OSError):
                parent.rmdir()

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def child(self, sub: str) -> LocalStorage:
        return LocalStorage(self._path(sub.strip("/")))


def _copy_with_crc(src: IO[bytes], dst: IO[bytes]) -> int:
    """Stream src into dst, fsync dst, and return the crc32c of the bytes read."""
    crc = google_crc32c.Checksum()
    while chunk := src.read(CHUNK):
        crc.update(chunk)
        dst.write(chunk)
    dst.flush()
    os.fsync(dst.fileno())
    return int.from_bytes(crc.digest(), "big")


def _verify_file(path: Path, expected: int, what: str) -> None:
    """Re-read a written file and raise StorageError unless its crc32c is `expected`."""
    got = crc32c_file(path)
    if got != expected:
        raise StorageError(f"{what}: crc32c mismatch (local {crc32c_b64(got)}, expected {crc32c_b64(expected)})")


class GCSStorage(Storage):
    """A prefix in a GCS bucket through the official client, with bounded retries on every call."""

    def __init__(self, client: storage.Client, bucket: str, prefix: str = "", *, timeout_s: float = 60):
        self._client = client
        self._bucket = client.bucket(bucket)
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.url = f"gs://{bucket}/{self.prefix}".rstrip("/")
        self.timeout_s = timeout_s
        from google.cloud.storage.retry import DEFAULT_RETRY

        # Exponential backoff within one deadline per call: a dead server costs timeout_s, not minutes.
        self._retry = DEFAULT_RETRY.with_timeout(timeout_s).with_delay(
            initial=0.25, maximum=min(8.0, timeout_s / 4), multiplier=2.0
        )
        self._request_timeout = (min(10.0, timeout_s), timeout_s)  # (connect, read) per HTTP request

    def _key(self, name: str) -> str:
        return _join(self.prefix, safe_relpath(name))

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn client exceptions into one-line StorageErrors; their text never carries credentials."""
        import requests
        from google.api_core import exceptions as api_exceptions
        from google.auth.exceptions import RefreshError, TransportError
        from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

        try:
            yield
        except api_exceptions.PreconditionFailed:
            raise ObjectExists(f"{what}: object already exists") from None
        except api_exceptions.NotFound:
            raise StorageError(f"{what}: not found (check that bucket '{self.bucket_name}' exists)") from None
        except (api_exceptions.Forbidden, api_exceptions.Unauthorized) as e:
            raise StorageError(f"{what}: permission denied (HTTP {e.code}); check the credentials' roles") from None
        except (RefreshError, TransportError) as e:
            raise StorageError(f"{what}: could not get an access token ({type(e).__name__})") from None
        except (api_exceptions.GoogleAPIError, requests.RequestException, InvalidResponse, DataCorruption) as e:
            detail = str(e).splitlines()[0][:300] if str(e) else ""
            raise StorageError(f"{what}: {type(e).__name__}: {detail}") from e

    def list(self, prefix: str = "", *, checksums: bool = True) -> dict[str, ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        found = {}
        with self._errors(f"list {self.url}/{prefix}"):
            blobs = self._client.list_blobs(
                self._bucket, prefix=root + prefix, retry=self._retry, timeout=self._request_timeout,
                fields="items(name,size,crc32c,generation),nextPageToken",
            )
            for blob in blobs:  # pages are fetched lazily inside this loop
                if blob.name.endswith("/"):
                    continue  # zero-byte "folder" placeholders made by the Cloud Console
                name = blob.name[len(root):]
                crc = crc32c_from_b64(blob.crc32c) if blob.crc32c else None
                found[name] = ObjectInfo(name, blob.size or 0, crc, blob.generation)
        return found

    def get(self, name: str, local_path: Path) -> ObjectInfo:
        blob = self._bucket.blob(self._key(name))
        partial = Path(f"{local_path}{PARTIAL_SUFFIX}")
        what = f"get {self.url}/{name}"
        try:
            with self._errors(what), open(partial, "wb") as f:
                blob.download_to_file(f, checksum="crc32c", retry=self._retry, timeout=self._request_timeout)
                f.flush()
                os.fsync(f.fileno())
            if blob.crc32c is None:  # the response carried no hash header: ask for the metadata
                with self._errors(what):
                    blob.reload(retry=self._retry, timeout=self._request_timeout)
            if blob.crc32c is None:
                raise StorageError(f"{what}: the server reports no crc32c, so the download cannot be verified")
            expected = crc32c_from_b64(blob.crc32c)
            _verify_file(partial, expected, what)
            os.replace(partial, local_path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return ObjectInfo(name, Path(local_path).stat().st_size, expected, _int_or_none(blob.generation))

    def put(self, local_path: Path, name: str, *, if_absent: bool = False) -> ObjectInfo:
        crc = crc32c_file(local_path)
        blob = self._bucket.blob(self._key(name), chunk_size=UPLOAD_CHUNK_SIZE)
        with self._errors(f"put {self.url}/{name}"):
            blob.upload_from_filename(
                str(local_path), checksum="crc32c", retry=self._retry, timeout=self._request_timeout,
                if_generation_match=0 if if_absent else None,
            )
        return self._check_uploaded(blob, name, crc)

    def put_bytes(self, data: bytes, name: str, *, if_absent: bool = False) -> ObjectInfo:
        blob = self._bucket.blob(self._key(name))
        with self._errors(f"put {self.url}/{name}"):
            blob.upload_from_string(
                data, checksum="crc32c", retry=self._retry, timeout=self._request_timeout,
                if_generation_match=0 if if_absent else None,
            )
        return self._check_uploaded(blob, name, google_crc32c.value(data))

    def _check_uploaded(self, blob: storage.Blob, name: str, crc: int) -> ObjectInfo:
        """Compare the crc32c the server reports for the new object with the local one."""
        stored = crc32c_from_b64(blob.crc32c) if blob.crc32c else None
        if stored != crc:
            raise StorageError(
                f"put {self.url}/{name}: server stored crc32c {blob.crc32c}, local file has {crc32c_b64(crc)}"
            )
        return ObjectInfo(name, blob.size, crc, _int_or_none(blob.generation))

    def delete(self, name: str) -> None:
        from google.api_core.exceptions import NotFound

        with self._errors(f"delete {self.url}/{name}"), contextlib.suppress(NotFound):
            self._bucket.blob(self._key(name)).delete(retry=self._retry, timeout=self._request_timeout)

    def exists(self, name: str) -> bool:
        with self._errors(f"exists {self.url}/{name}"):
            return self._bucket.blob(self._key(name)).exists(retry=self._retry, timeout=self._request_timeout)

    def child(self, sub: str) -> GCSStorage:
        return GCSStorage(self._client, self.bucket_name, self._key(sub.strip("/")), timeout_s=self.timeout_s)


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)


def parse_gs_url(url: str) -> tuple[str, str]:
    """Split 'gs://bucket/some/prefix' into ('bucket', 'some/prefix'), checking both parts."""
    bucket, _, prefix = url.removeprefix("gs://").partition("/")
    if not _BUCKET_NAME.match(bucket):
        raise PiconeoxError(
            f"bad bucket name {bucket!r} in {url!r}: expected gs://bucket/prefix with a bucket of 3-222 "
            "lowercase letters, digits, '-', '_' or '.'"
        )
    prefix = prefix.strip("/")
    if prefix:
        safe_relpath(prefix)
    return bucket, prefix


PREFLIGHT_PASSED_ENV = "PICONEOX_PREFLIGHT_PASSED"  # set by start_training.sh for the run it launches
_mode_warned: set[Path] = set()


def _read_key_file(path: Path, source: str) -> dict:
    """The parsed key, or one line naming the file (never quoting it) when it is not a readable JSON key."""
    if not path.is_file():
        raise PiconeoxError(f"credentials file {path} (from {source}) does not exist; see credentials/README.md")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PiconeoxError(f"credentials file {path} (from {source}) cannot be read: {type(e).__name__}") from None
    try:
        info = json.loads(text)
    except ValueError:
        info = None
    if not isinstance(info, dict) or "type" not in info:
        raise PiconeoxError(
            f"credentials file {path} (from {source}) is not a Google credentials JSON key "
            "(expected a service-account key downloaded from the Cloud Console)"
        )
    mode = path.stat().st_mode
    # once per key and process, and not again in a run that start_training.sh's preflight already warned for
    if mode & (stat.S_IRWXG | stat.S_IRWXO) and path not in _mode_warned and not os.environ.get(PREFLIGHT_PASSED_ENV):
        _mode_warned.add(path)
        log.warning("credentials file %s is readable by other users (mode %o); run: chmod 600 %s",
                    path, stat.S_IMODE(mode), path)
    return info


def _load_key(path: Path, source: str) -> tuple[Credentials, str | None]:
    """Credentials and project from a service-account key or a gcloud authorized-user file.

    Only these two types are accepted: a generic loader would also run external-account configs,
    which can fetch URLs or run commands named in the file.
    """
    from google.oauth2 import credentials as user_credentials
    from google.oauth2 import service_account

    info = _read_key_file(path, source)
    kind = info["type"]
    try:
        if kind == "service_account":
            creds = service_account.Credentials.from_service_account_info(info, scopes=SCOPES)
            return creds, info.get("project_id")
        if kind == "authorized_user":
            creds = user_credentials.Credentials.from_authorized_user_info(info, scopes=SCOPES)
            return creds, info.get("quota_project_id")
    except (ValueError, TypeError, KeyError):
        raise PiconeoxError(
            f"credentials file {path} (from {source}) is a malformed {kind} key (missing or invalid fields); "
            "download a fresh key from the Cloud Console"
        ) from None
    raise PiconeoxError(
        f"credentials file {path} (from {source}) has an unsupported credentials type; allowed are 'service_account' and 'authorized_user'"
    )


def resolve_credentials(key_file: str | None) -> tuple[Credentials, str | None]:
    """Credentials and project: --credentials file, then GOOGLE_APPLICATION_CREDENTIALS, then application
    default credentials. With STORAGE_EMULATOR_HOST set a given key is still checked, but anonymous
    credentials are used (emulators accept nothing else)."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError

    loaded = None
    if key_file:
        loaded = _load_key(Path(key_file), "--credentials")
    elif env_key := os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
        loaded = _load_key(Path(env_key), "GOOGLE_APPLICATION_CREDENTIALS")
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return AnonymousCredentials(), "emulator"
    if loaded:
        return loaded
    try:
        return google.auth.default(scopes=SCOPES)
    except DefaultCredentialsError:
        raise PiconeoxError(
            "no Google Cloud credentials found: pass --credentials credentials/<key>.json, set "
            "GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login` "
            "(see credentials/README.md)"
        ) from None


def open_storage(url: str, credentials: str | None = None, *, timeout_s: float = 60) -> Storage:
    """Open 'gs://bucket/prefix' (GCSStorage) or a local directory, plain or 'file://' (LocalStorage).

    credentials: a key file for gs:// URLs (ignored for local ones). timeout_s bounds each call,
    retries included.
    """
    if not timeout_s > 0:
        raise PiconeoxError(f"storage timeout must be a positive number of seconds, got {timeout_s}")
    if url.startswith("gs://"):
        bucket, prefix = parse_gs_url(url)
        from google.cloud import storage

        creds, project = resolve_credentials(credentials)
        client = storage.Client(project=project, credentials=creds)
        return GCSStorage(client, bucket, prefix, timeout_s=timeout_s)
    path = url.removeprefix("file://")
    if not path or "://" in path:
        raise PiconeoxError(f"unsupported storage location {url!r}: use gs://bucket/prefix, file:///path or a local path")
    return LocalStorage(path)
