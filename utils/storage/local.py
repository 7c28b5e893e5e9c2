"""A local directory used as a bucket: same names, crc32c checks and atomic publishing as GCS."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Callable

import google_crc32c

from utils.errors import PiconeoxError
from utils.crc import CHUNK, crc32c_b64, crc32c_file
from utils.storage.base import PARTIAL_SUFFIX, ObjectExists, ObjectInfo, Storage, StorageError, in_flight, no_link_below


class LocalStorage(Storage):
    """A directory used as a bucket: same names, checksums and atomicity as GCS, no account needed.

    A bucket holds objects, never links: a symbolic link (or a FIFO, socket or device) below the root is listed
    (unread, without a crc32c) and refused by every other call, so nothing outside the root is read or written
    through one, and no read blocks."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.url = str(self.root)

    def _path(self, name: str) -> Path:
        try:
            return no_link_below(self.root, name)
        except PiconeoxError as e:
            raise StorageError(f"{self.url}/{name}: {e}") from None

    def list(self, prefix: str = "", *, checksums: bool = True) -> dict[str, ObjectInfo]:
        found = {}
        folder, _, _ = prefix.rpartition("/")
        for dirpath, dirs, files in os.walk(self._path(folder) if folder else self.root):
            # os.walk lists a link to a folder among the folders and never enters it: list it, for get to refuse
            for file in files + [d for d in dirs if Path(dirpath, d).is_symlink()]:
                if in_flight(file):
                    continue
                path = Path(dirpath, file)
                name = path.relative_to(self.root).as_posix()
                if name.startswith(prefix):
                    regular = path.is_file() and not path.is_symlink()  # a FIFO would block the read: listed, refused
                    crc = crc32c_file(path) if checksums and regular else None
                    found[name] = ObjectInfo(name, path.lstat().st_size, crc, None)
        return found

    def get(self, name: str, local_path: Path) -> ObjectInfo:
        source = self._path(name)
        if not source.is_file():
            raise StorageError(f"get {self.url}/{name}: no such file" if not source.exists() else
                               f"get {self.url}/{name}: not a regular file")
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

