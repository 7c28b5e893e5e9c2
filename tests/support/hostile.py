"""The machinery of test_hostile.py: one driver process runs many CLI cases in-process, each under a memory
and a time bound, and the sandbox checks that say nothing was read or written outside a case's folder.

Bounds: the driver runs with `resource.setrlimit(RLIMIT_AS, 3 GiB)` (inherited by node, for rp2040.emulate), and
each case under `faulthandler.dump_traceback_later(CASE_S, exit=True)`: a case that hangs, even inside C code, ends
the driver after CASE_S seconds; it is recorded as timed out and the driver starts again on the cases after it.
Reads outside: every file under a case's `outside/` gets an access time older than its modification time, so the
first read of it moves the access time (relatime); stat'ing it does not.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Callable

from tests.support.bounds import bound
from tests.support.paths import REPO

LIMIT_AS = 3 << 30  # bytes of address space for the driver and its children; torch + a tiny model use < 1.5 GiB
CASE_S = bound(75)  # seconds a case may take before it is killed: a hang bound (the slowest honest case takes 9 s idle)
SLOW_CPU_S = 15  # CPU seconds (which load does not stretch) past which an honest case counts as near its bound

DRIVER = r"""
import contextlib, faulthandler, importlib, io, json, os, resource, sys, time, traceback
from tests.support.training import reset_accelerate_state
limit_as, case_s, results = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
for case_id, module, argv, cwd in json.load(sys.stdin):
    with open(results, "a") as f:
        f.write(json.dumps({"id": case_id, "started": True}) + "\n")
    os.chdir(cwd)
    err, start, cpu = io.StringIO(), time.monotonic(), sum(os.times()[:4])
    faulthandler.dump_traceback_later(case_s, exit=True)
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = importlib.import_module(module).main(argv)
        except SystemExit as e:
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = "raised"
    faulthandler.cancel_dump_traceback_later()
    reset_accelerate_state()  # each in-process training run builds its own Accelerator
    with open(results, "a") as f:
        f.write(json.dumps({"id": case_id, "code": code, "err": err.getvalue(), "s": time.monotonic() - start,
                            "cpu_s": sum(os.times()[:4]) - cpu,  # its work: CPU seconds, the same on a busy box
                            # VmHWM, not ru_maxrss: a driver forked from a big pytest process inherits that as its
                            # ru_maxrss (1.5 GB late in a full run), while VmHWM is this image's own peak
                            "maxrss_mb": next(int(line.split()[1]) for line in open("/proc/self/status")
                                              if line.startswith("VmHWM")) // 1024}) + "\n")
"""


CASES: list["Case"] = []  # every case of hostile_checkpoints.py, hostile_folders.py and hostile_io.py, in order


def case(id, message, code=2, **kw):
    """Register the decorated builder as a Case."""
    def register(build):
        CASES.append(Case(id, build, message, code, **kw))
        return build
    return register


@dataclass
class Case:
    """One hostile input to one CLI. `build(work, outside, base)` makes the input (under `work`, with whatever it
    points at under `outside`) and returns (module, argv); `code` and `message` are what must come out."""

    id: str
    build: Callable
    message: str
    code: int = 2
    leftovers: tuple[str, ...] = ()  # globs (relative to work) a refusal may leave: caches, never outputs
    check: Callable | None = None  # extra assertions after the run: check(work, outside)
    xfail: str | None = None
    argv: list = field(default_factory=list)
    module: str = ""


def run_driver(cases: list[Case], root: Path, env: dict) -> dict[str, dict]:
    """Run `cases` (built: module and argv set) in driver processes; {id: result}. A case that outlives CASE_S or
    dies is recorded with code "killed" and the next driver goes on after it."""
    results_file = root / "results.jsonl"
    todo = [[c.id, c.module, c.argv, str(root / c.id / "work")] for c in cases]
    results: dict[str, dict] = {}
    while todo:
        results_file.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "-c", DRIVER, str(LIMIT_AS), str(CASE_S), str(results_file)],
                              input=json.dumps(todo), text=True, capture_output=True, cwd=root, timeout=bound(600),
                              env={**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
        lines = [json.loads(line) for line in results_file.read_text().splitlines()] if results_file.exists() else []
        done = {r["id"]: r for r in lines if "code" in r}
        results.update(done)
        started = [r["id"] for r in lines if "started" in r and r["id"] not in done]
        if started:  # the case in flight hung (or crashed the driver)
            results[started[0]] = {"code": "killed", "err": proc.stderr[-3000:], "s": CASE_S, "cpu_s": CASE_S,
                               "maxrss_mb": 0}
        elif not done and todo:
            raise AssertionError(f"the driver failed before any case: {proc.stderr[-3000:]}")
        todo = [t for t in todo if t[0] not in results]
    return results


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:  # streamed: a case's oversized (sparse) file is GBs
        return hashlib.file_digest(f, "sha256").hexdigest()


def snapshot(folder: Path, read: bool = True) -> dict[str, tuple]:
    """Every entry under `folder` without following links: kind, size, and a hash of the bytes (`read`) or the
    modification time; a link's target. Reading is only for folders whose access times do not matter."""
    found = {}
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(dirpath, name)
            st = path.lstat()
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_file():
                found[rel] = ("file", st.st_size, _sha256(path) if read else st.st_mtime_ns)
            elif path.is_dir():
                found[rel] = ("dir",)
            else:
                found[rel] = ("special", st.st_mode)
    return found


def arm_outside(outside: Path) -> dict[str, int]:
    """Give every regular file under `outside` an access time before its modification time: a later read moves
    it. Returns {path: access time}."""
    times = {}
    for path in outside.rglob("*"):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            os.utime(path, ns=(st.st_mtime_ns - 10**12, st.st_mtime_ns))
            times[str(path)] = path.stat().st_atime_ns
    return times


def reads_are_seen(folder: Path) -> bool:
    """Whether this filesystem moves an armed access time on a read (not with noatime: then no read is seen)."""
    probe = folder / "atime-probe"
    probe.write_text("probe")
    armed = arm_outside(folder)
    probe.read_text()
    seen = bool(read_outside(armed))
    probe.unlink()
    return seen


def read_outside(times: dict[str, int]) -> list[str]:
    """The files of `arm_outside` read since."""
    return [p for p, t in times.items() if Path(p).stat().st_atime_ns != t]


def changed(before: dict, after: dict, allowed: tuple[str, ...] = ()) -> list[str]:
    """Entries that appeared, went or changed, except those under a glob of `allowed`."""
    keys = set(before) | set(after)
    return sorted(k for k in keys if before.get(k) != after.get(k)  # an allowed path, what it holds, its parents
                  and not any(fnmatch(k, g) or fnmatch(k, g + "/*") or g.startswith(k + "/") for g in allowed))


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def oversize(path: Path, size: int | None = None) -> None:
    """`path` grown to `size` bytes, by default one over what a JSON reader takes (sparse: nothing to write)."""
    from utils.textfile import MAX_JSON_BYTES

    with open(path, "r+b") as f:
        f.truncate(size or MAX_JSON_BYTES + 1)
