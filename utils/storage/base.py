"""The storage protocol every backend follows: list with size and crc32c, get, put, delete."""
from __future__ import annotations

import stat
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from utils.errors import PiconeoxError

PARTIAL_SUFFIX = ".partial"


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
    backslashes and control characters (NUL, newline, ...: a newline would forge a second line in a message).
    """
    reason = None
    if not isinstance(name, str) or not name:
        reason = "it is empty" if name == "" else "it is not a string"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        reason = "it contains a control character"
    elif "\\" in name:
        reason = "it contains a backslash"
    elif name.startswith("/"):
        reason = "it is absolute"
    elif any(part in ("", ".", "..") for part in name.split("/")):
        reason = "it has an empty, '.' or '..' segment"
    if reason:
        raise PiconeoxError(
            f"refusing object name {name!r}: {reason}; allowed are relative '/'-separated paths "
            "without '..', '.', empty segments, backslashes or control characters"
        )
    return name


def no_link_below(root: str | Path, name: str) -> Path:
    """`root/name` for a safe relative `name` when nothing below `root` on the way is a symbolic link.

    The one path rule of checkpoint, dataset and local-bucket folders: they hold regular files and folders,
    never links, so no name inside them reaches outside; nor FIFOs, sockets or devices, which block or never end
    a read. The folder the user names (`root`) may be a link.
    """
    path = Path(root)
    for part in safe_relpath(name).split("/"):
        path = path / part
        if path.is_symlink():
            raise PiconeoxError(f"{path} is a symbolic link: checkpoint, dataset and bucket folders hold regular "
                                "files only, never links (copy the file in instead)")
    if not special(path):
        return path
    raise PiconeoxError(f"{path} is not a regular file (a FIFO, socket or device): checkpoint, dataset and bucket "
                        "folders hold regular files only")


def special(path: Path) -> bool:
    """Whether `path` exists as something other than a regular file, a folder or a link (read without following)."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))


class Storage(ABC):
    """A flat namespace of objects under a root (a local directory or a bucket prefix)."""

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
