"""Hostile pickles for the bounded walk (deep stacks, hash collisions, object counts) and a forked child to run a
loader under a memory limit and a hang bound."""
from __future__ import annotations

import io
import os
import pickle
import resource
import signal
import struct
import sys
import tempfile
import time
import traceback
import zipfile

P61 = (1 << 61) - 1  # every multiple hashes to 0


def mark_tuple_pairs(size: int = 1 << 20) -> bytes:
    """`size` bytes: EMPTY_TUPLEs, then MARK TUPLE pairs on the tall stack (the old walk copied it at each)."""
    half = size // 2
    return b"\x80\x02" + b")" * half + b"(t" * (half // 2) + b")."


def colliding_dict(keys: int) -> bytes:
    """A dict of `keys` int keys that all hash to 0, as pickle protocol 2 writes it (written here directly:
    building the dict to dump it would take the time the attack costs)."""
    out = [b"\x80\x02}("]
    for i in range(keys):
        key = pickle.encode_long(i * P61)
        out.append(b"\x8a" + bytes([len(key)]) + key + b"N")
        if i % 1000 == 999:
            out.append(b"u(")
    out.append(b"u.")
    return b"".join(out)


def objects_left_on_the_stack(count: int) -> bytes:
    """`count` Nones left on the stack below a root of one object: reachable from nothing."""
    return b"\x80\x02" + b"N" * count + b"N."


def long_walk(pairs: int) -> bytes:
    """`pairs` MARK POP_MARK pairs (nothing built, every opcode walked), then None."""
    return b"\x80\x02" + b"(1" * pairs + b"N."


def big_bytes_pickle(size: int) -> bytes:
    """One BINBYTES8 of `size` bytes."""
    return b"\x80\x04\x8e" + struct.pack("<Q", size) + bytes(size) + b"."


def torch_zip(data_pkl: bytes) -> bytes:
    """A torch.save-shaped zip whose data.pkl is `data_pkl`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def address_space() -> int:
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) << 10


def in_child(call, extra_memory: int, deadline: float, nofile: int | None = None) -> tuple[int | str, str]:
    """(exit code, or "timeout"; stderr) of `call()` in a forked child whose address space may grow by
    `extra_memory` bytes (RLIMIT_AS; RLIMIT_NOFILE = `nofile`), stdin closed (a prompt fails, never waits),
    SIGKILLed after `deadline` seconds (a hang bound, not a timing goal)."""
    err = tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.dup2(err.fileno(), 2)
            sys.stderr = open(2, "w", closefd=False)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            limit = address_space() + extra_memory
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
            code = call() or 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            err.seek(0)
            return os.waitstatus_to_exitcode(status), err.read().decode(errors="replace")
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "timeout", ""
