"""What the loaders' hostile-input tests share: a loader call in a forked child under a memory cap and a hang bound
(`bounded`), the one-error-line check, a checkpoint's marker recomputed over what its folder holds (anyone can), a
hash bomb, and a record of a DCP index pointed at other bytes."""
from __future__ import annotations

import pickle
from pathlib import Path

from tests.support.bounds import bound
from tests.support.hostile_pickles import in_child
from tests.support.training import run
from utils.ckpt.format import DCP_INDEX, MARKER, manifest, read_marker, write_marker

EXTRA_MEMORY = 3 << 30
DEADLINE = bound(45)  # seconds: a refusal takes a few; an unguarded loader hangs for minutes


def bounded(call, deadline: float = DEADLINE, nofile: int | None = None) -> tuple[int | str, str]:
    """(exit code, or "timeout"; its stderr) of `call()` in a forked child with RLIMIT_AS = its size + EXTRA_MEMORY
    (and RLIMIT_NOFILE = `nofile`), killed after `deadline` seconds."""
    return in_child(call, EXTRA_MEMORY, deadline, nofile)


def assert_one_line(result, *words):
    code, err = result
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, (code, err[-3000:])
    assert all(w in errors[0] for w in words), errors[0]


def remark_all(folder: Path) -> None:
    """Recompute the COMPLETE marker over what the folder now holds (anyone can)."""
    marker = read_marker(folder)
    names = [p.name for p in folder.iterdir() if p.is_file() and p.name != MARKER]
    write_marker(folder, marker["step"], marker["world_size"], manifest(folder, sorted(names)))


def hash_bomb() -> bytes:
    """1 KB, no globals: 64 tuples nested through the memo, used as a dict key (2**64 steps to hash)."""
    t = ()
    for _ in range(64):
        t = (t, t)
    return b"\x80\x02}" + pickle.dumps(t, protocol=2)[2:-1] + b"K\x01s."


def replace_record(folder: Path, fqn_start: str, data: bytes) -> None:
    """Point the index entry of the first record named `fqn_start...` at `data`, appended to its .distcp file."""
    import dataclasses

    meta = pickle.loads((folder / DCP_INDEX).read_bytes())  # our own fixture's index: trusted
    index = next(i for i in meta.storage_data if i.fqn.startswith(fqn_start))
    path = folder / meta.storage_data[index].relative_path
    meta.storage_data[index] = dataclasses.replace(meta.storage_data[index], offset=path.stat().st_size,
                                                   length=len(data))
    with open(path, "ab") as f:
        f.write(data)
    (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))


def generate(folder, *extra):
    from utils.generate import main
    return lambda: main([str(folder), "--max-new-tokens", "2", *extra])


def consolidate(folder, out):
    from utils.consolidate import main
    return lambda: main([str(folder), "--out", str(out)])


def resume(work, data, folder):
    return lambda: run(work, data, "--max-steps", "12", "--resume", str(folder))[0]
