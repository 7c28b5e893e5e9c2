"""The one flock(2) of the project, with the one fallback for filesystems without locks.

NFS without lockd fails flock with ENOLCK (EBADF on a file open read-only), Lustre without `-o flock` with ENOSYS
or EOPNOTSUPP. There the caller goes on without the lock, after one warning line per process: the run lock
(utils/run/runlock.py) and the demo dataset's preparation (utils/data/source.py) both use this.
"""
from __future__ import annotations

import errno
import fcntl
import sys
from pathlib import Path

NO_FLOCK = {errno.ENOLCK, errno.EBADF, errno.ENOSYS, errno.EOPNOTSUPP}  # NFS without locks, Lustre without -o flock
_warned = False


def exclusive(fd: int, folder: Path, without: str) -> bool:
    """flock(LOCK_EX) on `fd` (a regular file open for writing: NFS emulates flock only there); False after one
    warning line per process when `folder`'s filesystem has no locks, `without` saying what goes unguarded."""
    global _warned
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    except OSError as e:
        if e.errno not in NO_FLOCK:
            raise
        if not _warned:
            _warned = True
            print(f"warning: {folder} has no file locks ({errno.errorcode.get(e.errno, e.errno)}: NFS without lockd "
                  f"or Lustre without -o flock?); {without}", file=sys.stderr)
        return False
