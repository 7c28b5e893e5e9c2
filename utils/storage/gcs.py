"""A gs:// bucket prefix through the official client, and the credentials it runs with.

GCS calls retry transient errors with backoff inside a bounded deadline (`timeout_s`), so a dead
server fails within that time instead of minutes per call. Imported only when a gs:// URL is opened.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from pathlib import Path
from typing import Iterator

import google.auth
import google_crc32c
import requests
from google.api_core import exceptions as api_exceptions
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.exceptions import DefaultCredentialsError, RefreshError, TransportError
from google.cloud import storage
from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
from google.cloud.storage.retry import DEFAULT_RETRY
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account

from utils.crc import crc32c_b64, crc32c_file, crc32c_from_b64
from utils.errors import PiconeoxError
from utils.storage.base import PARTIAL_SUFFIX, ObjectExists, ObjectInfo, Storage, StorageError, _join, safe_relpath
from utils.storage.local import _verify_file

log = logging.getLogger(__name__)

SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write"]
UPLOAD_CHUNK_SIZE = 8 << 20  # resumable uploads send 8 MiB chunks (a multiple of 256 KiB, as GCS requires)


class GCSStorage(Storage):
    """A prefix in a GCS bucket through the official client, with bounded retries on every call."""

    def __init__(self, client: storage.Client, bucket: str, prefix: str = "", *, timeout_s: float = 60):
        self._client = client
        self._bucket = client.bucket(bucket)
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.url = f"gs://{bucket}/{self.prefix}".rstrip("/")
        self.timeout_s = timeout_s
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
        with self._errors(f"delete {self.url}/{name}"), contextlib.suppress(api_exceptions.NotFound):
            self._bucket.blob(self._key(name)).delete(retry=self._retry, timeout=self._request_timeout)

    def exists(self, name: str) -> bool:
        with self._errors(f"exists {self.url}/{name}"):
            return self._bucket.blob(self._key(name)).exists(retry=self._retry, timeout=self._request_timeout)

    def child(self, sub: str) -> GCSStorage:
        return GCSStorage(self._client, self.bucket_name, self._key(sub.strip("/")), timeout_s=self.timeout_s)


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)


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
        f"credentials file {path} (from {source}) has an unsupported credentials type; allowed are "
        "'service_account' and 'authorized_user'"
    )


def resolve_credentials(key_file: str | None) -> tuple[Credentials, str | None]:
    """Credentials and project: --credentials file, then GOOGLE_APPLICATION_CREDENTIALS, then application
    default credentials. With STORAGE_EMULATOR_HOST set a given key is still checked, but anonymous
    credentials are used (emulators accept nothing else)."""
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



def check_credentials(key_file: str | None) -> None:
    """The credentials load (a key file given is read and checked); no bucket is read."""
    resolve_credentials(key_file)


def open_bucket(bucket: str, prefix: str, key_file: str | None, timeout_s: float) -> GCSStorage:
    """`gs://bucket/prefix` (both checked by utils.storage.split_url) with the credentials resolved here."""
    creds, project = resolve_credentials(key_file)
    return GCSStorage(storage.Client(project=project, credentials=creds), bucket, prefix, timeout_s=timeout_s)
