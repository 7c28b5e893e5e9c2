"""An s3:// bucket prefix through boto3: Amazon S3, or an S3-compatible store (R2, MinIO) named by AWS_ENDPOINT_URL.

Credentials and region come from boto3's own chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE and
~/.aws, an instance role; AWS_REGION); AWS_ENDPOINT_URL points the client at another store. Imported only when an
s3:// URL is used.

Checksums: every object this module writes carries its CRC32C (4 big-endian bytes, base64, as GCS reports it) in
its metadata `crc32c`, which listings (one HEAD per object) and downloads compare against; a single PUT also sends it
as S3's own CRC32C checksum, which S3 checks the received bytes against. An object without a CRC32C (written by
another tool) is never trusted: a download of it is refused, and a sync never skips it. Uploads above `part_size`
go up in parts (s3transfer), each part checked by the SDK's CRC32, then the whole object by a HEAD of its size and
crc32c.
"""
from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Iterator

import boto3
import google_crc32c
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from utils.crc import crc32c_b64, crc32c_file, crc32c_from_b64
from utils.errors import PiconeoxError
from utils.storage.base import PARTIAL_SUFFIX, ObjectExists, ObjectInfo, Storage, StorageError, _join, safe_relpath
from utils.storage.local import _copy_with_crc, _verify_file

PART_SIZE = 64 << 20  # files above this go up in 64 MiB parts (S3 allows at most 5 GiB in one PUT)
META = "crc32c"  # the metadata key holding an object's CRC32C
CREDENTIALS_HELP = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE); for R2 or MinIO also "
                    "AWS_ENDPOINT_URL (see credentials/README.md)")
NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
REFUSED = {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}


class S3Storage(Storage):
    """A prefix in an S3 bucket; every call bounded by `timeout_s` per request, with the SDK's standard retries."""

    def __init__(self, client, bucket: str, prefix: str = "", *, timeout_s: float = 60, part_size: int = PART_SIZE):
        self._client = client
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.timeout_s = timeout_s
        self.part_size = part_size

    def _key(self, name: str) -> str:
        return _join(self.prefix, safe_relpath(name))

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Client exceptions as one-line StorageErrors: the error code and the server's message, never a key."""
        try:
            yield
        except NoCredentialsError:
            raise StorageError(f"{what}: no AWS credentials found; {CREDENTIALS_HELP}") from None
        except ClientError as e:
            error = e.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code in ("PreconditionFailed", "412"):
                raise ObjectExists(f"{what}: object already exists") from None
            if code == "NoSuchBucket":
                raise StorageError(f"{what}: not found (check that bucket '{self.bucket_name}' exists)") from None
            if code in NOT_FOUND:
                raise StorageError(f"{what}: not found") from None
            if code in REFUSED:
                raise StorageError(f"{what}: permission denied ({code}); check the credentials and their "
                                   "permissions") from None
            message = str(error.get("Message", "")).splitlines()[0][:300] if error.get("Message") else ""
            raise StorageError(f"{what}: {code or type(e).__name__}: {message}") from None
        except BotoCoreError as e:  # unreachable endpoint, timeouts, a response cut short
            detail = str(e).splitlines()[0][:300] if str(e) else ""
            raise StorageError(f"{what}: {type(e).__name__}: {detail}") from None

    def _head(self, key: str) -> dict:
        return self._client.head_object(Bucket=self.bucket_name, Key=key, ChecksumMode="ENABLED")

    def list(self, prefix: str = "", *, checksums: bool = True) -> dict[str, ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        sizes = {}
        with self._errors(f"list {self.url}/{prefix}"):
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket_name,
                                                                                Prefix=root + prefix):
                for item in page.get("Contents", []):
                    if not item["Key"].endswith("/"):  # zero-byte "folder" placeholders of some consoles
                        sizes[item["Key"][len(root):]] = item["Size"]
        if not checksums:
            return {name: ObjectInfo(name, size, None, None) for name, size in sizes.items()}

        def info(name: str) -> ObjectInfo:  # a listing carries no checksum values: one HEAD per object
            with self._errors(f"list {self.url}/{name}"):
                head = self._head(root + name)
            return ObjectInfo(name, head["ContentLength"], stored_crc32c(head), None)

        with ThreadPoolExecutor(max_workers=8) as pool:
            return {found.name: found for found in pool.map(info, sorted(sizes))}

    def get(self, name: str, local_path: Path) -> ObjectInfo:
        what = f"get {self.url}/{name}"
        partial = Path(f"{local_path}{PARTIAL_SUFFIX}")
        try:
            with self._errors(what):
                head = self._head(self._key(name))
            expected = stored_crc32c(head)
            if expected is None:
                raise StorageError(f"{what}: the object has no crc32c, so the download cannot be verified; upload it "
                                   "with download_training_data.py --push (or push_checkpoint) instead")
            with self._errors(what), open(partial, "wb") as f:  # IfMatch: the object the HEAD described, or 412
                body = self._client.get_object(Bucket=self.bucket_name, Key=self._key(name), IfMatch=head["ETag"])
                _copy_with_crc(body["Body"], f)
            if partial.stat().st_size != head["ContentLength"]:
                raise StorageError(f"{what}: got {partial.stat().st_size} bytes, the object has "
                                   f"{head['ContentLength']}")
            _verify_file(partial, expected, what)
            os.replace(partial, local_path)
        except ObjectExists:  # the IfMatch failed: the object was replaced after the HEAD
            partial.unlink(missing_ok=True)
            raise StorageError(f"{what}: the object changed during the download; try again") from None
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return ObjectInfo(name, Path(local_path).stat().st_size, expected, None)

    def put(self, local_path: Path, name: str, *, if_absent: bool = False) -> ObjectInfo:
        crc, size = crc32c_file(local_path), Path(local_path).stat().st_size
        key, what = self._key(name), f"put {self.url}/{name}"
        if size <= self.part_size:
            with open(local_path, "rb") as f:
                self._put_one(f, key, crc, what, if_absent)
        else:
            if if_absent and self.exists(name):  # a multipart upload has no IfNoneMatch in s3transfer
                raise ObjectExists(f"{what}: object already exists")
            config = TransferConfig(multipart_threshold=self.part_size, multipart_chunksize=self.part_size,
                                    max_concurrency=4)  # beside the sync's own workers, within the client's pool
            with self._errors(what):
                self._client.upload_file(str(local_path), self.bucket_name, key, Config=config,
                                         ExtraArgs={"Metadata": {META: crc32c_b64(crc)}})
        return self._check_uploaded(key, name, crc, size)

    def put_bytes(self, data: bytes, name: str, *, if_absent: bool = False) -> ObjectInfo:
        crc = google_crc32c.value(data)
        key = self._key(name)
        self._put_one(data, key, crc, f"put {self.url}/{name}", if_absent)
        return self._check_uploaded(key, name, crc, len(data))

    def _put_one(self, body: bytes | IO[bytes], key: str, crc: int, what: str, if_absent: bool) -> None:
        """One PUT carrying the CRC32C twice: as S3's checksum (checked on receipt) and in the metadata."""
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        with self._errors(what):
            self._client.put_object(Bucket=self.bucket_name, Key=key, Body=body, Metadata={META: crc32c_b64(crc)},
                                    ChecksumAlgorithm="CRC32C", ChecksumCRC32C=crc32c_b64(crc), **extra)

    def _check_uploaded(self, key: str, name: str, crc: int, size: int) -> ObjectInfo:
        """Compare the size and crc32c the server reports for the new object with the local ones."""
        with self._errors(f"put {self.url}/{name}"):
            head = self._head(key)
        stored = stored_crc32c(head)
        if stored != crc or head["ContentLength"] != size:
            raise StorageError(f"put {self.url}/{name}: server stored {head['ContentLength']} bytes with crc32c "
                               f"{crc32c_b64(stored) if stored is not None else 'none'}, local file has {size} bytes, "
                               f"{crc32c_b64(crc)}")
        return ObjectInfo(name, size, crc, None)

    def delete(self, name: str) -> None:
        with self._errors(f"delete {self.url}/{name}"):  # S3 answers 204 for a missing key too
            self._client.delete_object(Bucket=self.bucket_name, Key=self._key(name))

    def exists(self, name: str) -> bool:
        with self._errors(f"exists {self.url}/{name}"):
            try:
                self._client.head_object(Bucket=self.bucket_name, Key=self._key(name))
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in NOT_FOUND:
                    return False
                raise
        return True

    def child(self, sub: str) -> S3Storage:
        return S3Storage(self._client, self.bucket_name, self._key(sub.strip("/")), timeout_s=self.timeout_s,
                         part_size=self.part_size)


def stored_crc32c(head: dict) -> int | None:
    """An object's CRC32C: our metadata, else S3's own full-object CRC32C; None when it has neither."""
    value = head.get("Metadata", {}).get(META)
    if value is None and head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
        value = head.get("ChecksumCRC32C")
    try:
        return crc32c_from_b64(value) if value else None
    except ValueError:  # not base64 of 4 bytes: as good as none
        return None


def check_credentials(key_file: str | None = None) -> None:
    """boto3 finds credentials (environment, profile, instance role); `key_file` is Google's and not read here."""
    try:
        found = boto3.session.Session().get_credentials()
    except BotoCoreError as e:  # a malformed ~/.aws/config or profile: its name, never its content
        raise PiconeoxError(f"AWS credentials cannot be loaded ({type(e).__name__}); {CREDENTIALS_HELP}") from None
    if found is None:
        raise PiconeoxError(f"no AWS credentials found for s3://: {CREDENTIALS_HELP}")


def open_bucket(bucket: str, prefix: str, key_file: str | None, timeout_s: float) -> S3Storage:
    """`s3://bucket/prefix` (both checked by utils.storage.split_url) through a client bounded by `timeout_s`."""
    check_credentials(key_file)
    config = Config(connect_timeout=min(10.0, timeout_s), read_timeout=timeout_s,
                    retries={"mode": "standard", "total_max_attempts": 4}, max_pool_connections=40)
    try:
        client = boto3.session.Session().client("s3", config=config)
    except (BotoCoreError, ValueError) as e:  # a bad AWS_ENDPOINT_URL or region
        raise PiconeoxError(f"cannot open s3://{bucket}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    return S3Storage(client, bucket, prefix, timeout_s=timeout_s)
