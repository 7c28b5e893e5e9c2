"""A real S3 server on 127.0.0.1 for tests: moto's server mode, driven through boto3 like Amazon S3.

The server starts once per session (moto is imported only then); each test gets a fresh, empty bucket and the
AWS variables of a store on 127.0.0.1 (`s3_env`): dummy credentials, AWS_ENDPOINT_URL, no instance-metadata
lookup and no ~/.aws files, so nothing reaches the internet or reads the machine's own credentials. They are set
only for that test (monkeypatch), and subprocesses the test starts inherit them.
"""
from __future__ import annotations

import base64
import itertools
import logging
from dataclasses import dataclass
from typing import Iterator

import google_crc32c
import pytest

_bucket_numbers = itertools.count()
SECRET = "piconeox-test-secret-never-printed"  # the dummy secret key: no output may ever show it


def s3_env(endpoint: str) -> dict[str, str]:
    """The variables of an S3-compatible store at `endpoint` with dummy credentials, and no lookup elsewhere."""
    return {"AWS_ACCESS_KEY_ID": "piconeox-test-key", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials"}


AWS_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE")


@dataclass
class S3Server:
    """A running server with one empty bucket for the current test."""

    endpoint: str  # the AWS_ENDPOINT_URL value, e.g. http://127.0.0.1:5000
    bucket: str
    client: object  # a boto3 S3 client of its own, behind the back of the code under test

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def put(self, name: str, data: bytes) -> None:
        """Create or replace an object behind the back of the code under test, with S3's own CRC32C checksum (as
        `aws s3 cp --checksum-algorithm CRC32C` stores it; on GCS every object has one)."""
        crc = base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()
        self.client.put_object(Bucket=self.bucket, Key=name, Body=data, ChecksumAlgorithm="CRC32C",
                               ChecksumCRC32C=crc)

    def put_unchecked(self, name: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        """An object without a CRC32C (another tool's upload), or with the given metadata only."""
        self.client.put_object(Bucket=self.bucket, Key=name, Body=data, Metadata=metadata or {})

    def read(self, name: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=name)["Body"].read()

    def metadata(self, name: str) -> dict[str, str]:
        return self.client.head_object(Bucket=self.bucket, Key=name)["Metadata"]

    def names(self, prefix: str = "") -> list[str]:
        listed = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix).get("Contents", [])
        return sorted(item["Key"] for item in listed)


@pytest.fixture(scope="session")
def _moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one request log line per call otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_server(_moto_server, monkeypatch) -> S3Server:
    """moto's S3 server with a fresh, empty bucket for this test, and the AWS variables pointing at it."""
    import boto3

    for key in AWS_UNSET:
        monkeypatch.delenv(key, raising=False)
    for key, value in s3_env(_moto_server).items():
        monkeypatch.setenv(key, value)
    client = boto3.session.Session().client("s3")
    bucket = f"piconeox-test-{next(_bucket_numbers)}"
    client.create_bucket(Bucket=bucket)
    return S3Server(_moto_server, bucket, client)
