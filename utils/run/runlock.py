"""One run per name: a lock file held by every process that writes the run, for as long as it writes.

    <output-dir>/.locks/<run>.lock        (<run>.machine-<R>.lock on machine R of a multi-machine job)

It lies beside the run folders, never inside one, so removing a refused run's folders never removes a lock.
Each line is one holder as JSON (host, pid, the process's start time, role); the first line is the owner:
start_training.sh (its preflight takes the lock in the launcher's name, `OWNER_ENV`), else the torchrun
agent of a bare `accelerate launch`, else a lone train.py. Every training process then joins with its own
line. A lock is live while any holder runs; whoever leaves last removes it. A lock whose holders are all
gone (everything was SIGKILLed) is taken over with one warning line; a live one refuses the new run in one
line naming its pids and host. Every check-and-write happens under flock(2) on the regular file .locks/.guard,
so two runs started at once cannot both win; a filesystem without locks (NFS without lockd, Lustre without
-o flock) gets one warning line, and the run goes on.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from utils.atomic import check_writable_dir
from utils.errors import PiconeoxError
from utils.flock import exclusive
from utils.run.allocation import MACHINE_ENV

OWNER_ENV = "PICONEOX_RUN_LOCK_OWNER"  # the launcher's pid: the lock it took is its workers' to join
NOTE_ENV = "PICONEOX_RUN_LOCK_NOTE"  # a file the preflight writes the lock's path into, for the launcher
_made_here: set[Path] = set()  # output folders this process created for a lock: removed with it when empty


class RunLocked(PiconeoxError):
    """Another live process writes this run."""


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart); None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] in "ZX" else int(fields[19])  # a zombie writes nothing any more


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    start: int | None
    role: str

    @classmethod
    def of(cls, pid: int, role: str) -> Holder:
        return cls(socket.gethostname(), pid, start_time(pid), role)

    def alive(self) -> bool | None:
        """True/False on this host; None for another host's process (it cannot be checked from here)."""
        if self.host != socket.gethostname():
            return None
        return self.start is not None and start_time(self.pid) == self.start


def lock_path(output_dir: str | Path, run: str) -> Path:
    """Where the run's lock lives (one per machine of a multi-machine job: machines may share output_dir)."""
    machine = os.environ.get(MACHINE_ENV)
    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if machine is None and world and local and world != local:
        machine = os.environ.get("GROUP_RANK")  # torchrun's node rank
    return Path(output_dir) / ".locks" / (f"{run}.machine-{machine}.lock" if machine else f"{run}.lock")


def owner() -> tuple[int, str]:
    """(pid, role) of whose lock this process may join: its launcher's, else its torchrun agent's, else its own."""
    if os.environ.get(OWNER_ENV, "").isdigit():
        return int(os.environ[OWNER_ENV]), "start_training.sh"
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return os.getppid(), "accelerate launch"
    return os.getpid(), "train.py"


GUARD = ".guard"  # the regular file every check-and-write flocks: NFS emulates flock only on a file open for writing


@contextlib.contextmanager
def _guarded(folder: Path):
    """flock(2) on the folder's guard file; retried when the last release removed it meanwhile. A filesystem
    without locks gets one warning line per process and no guard (per-machine lock names keep machines apart)."""
    if folder.exists() and not folder.is_dir():
        raise PiconeoxError(f"{folder} is a file, not the folder of run locks: move it away (no run uses it)")
    if (folder / GUARD).is_dir():  # a folder, or a link to one
        raise PiconeoxError(f"{folder / GUARD} is a folder, not the run locks' guard file: remove it (no run uses it)")
    while True:
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(folder / GUARD, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if not exclusive(fd, folder, "the run lock is checked without them: do not start this run twice "
                                             "at once"):
                    break
            except OSError:
                os.close(fd)
                raise
            with contextlib.suppress(FileNotFoundError):
                if os.path.samestat(os.fstat(fd), os.stat(folder / GUARD)):
                    break
            os.close(fd)
    try:
        yield
    finally:
        os.close(fd)


def _read(path: Path) -> list[Holder]:
    """The holders in the lock file; lines that are no holder (garbage, a torn write) are skipped."""
    if path.is_dir():
        raise PiconeoxError(f"lock {path} is a folder, not a lock file: remove it if no run of this name is running")
    try:
        lines = path.read_bytes().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return []
    holders = []
    for line in lines:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            holders.append(Holder(**json.loads(line)))
    return holders


def _describe(holders: list[Holder]) -> str:
    hosts = sorted({h.host for h in holders})
    pids = ", ".join(f"{h.pid} ({h.role})" for h in holders)
    return f"pid{'s' if len(holders) > 1 else ''} {pids} on {' and '.join(hosts)}"


def hold(path: Path, run: str, role: str, pid: int | None = None, warn=None) -> Holder:
    """Add `pid` (default: this process) to the run's lock: join its owner's lock, or take a free or stale one.

    Raises RunLocked (one line naming the run, pids and host) when another generation still holds it.
    """
    me = Holder.of(os.getpid() if pid is None else pid, role)
    boss = Holder.of(*owner())
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    with _guarded(path.parent):
        holders = _read(path)
        if not holders and path.exists() and path.stat().st_size:
            warn(f"run {run}: taking over the lock {path}, which names no holder (damaged or not a lock)")
        joining = holders and (holders[0].host, holders[0].pid, holders[0].start) == (boss.host, boss.pid, boss.start)
        if holders and not joining:
            live = [h for h in holders if h.alive() is not False]
            if live:
                elsewhere = any(h.alive() is None for h in live)
                elsewhere = " (another host: delete the lock if that run is gone)" if elsewhere else ""
                raise RunLocked(f"run {run} is still being written by {_describe(live)} (lock {path}{elsewhere}); "
                                "stop it first, or wait for its save to finish")
            warn(f"run {run}: taking over the lock {path} left by {_describe(holders)}, no longer running")
            holders = []
        if not holders:
            holders = [me] if me.pid == boss.pid else [boss, me]
        elif me not in holders:
            holders.append(me)
        _write(path, holders)
    return me


def _write(path: Path, holders: list[Holder]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(asdict(h)) + "\n" for h in holders))
    os.replace(tmp, path)


def release(path: Path, me: Holder) -> None:
    """`me` stops writing: its line goes; the lock goes with the last holder that runs."""
    with _guarded(path.parent):
        holders = _read(path)
        if me not in holders:
            return  # taken over meanwhile (we were considered dead): not ours to change
        rest = [h for h in holders if h != me]
        if any(h.alive() for h in rest):
            _write(path, rest)
            return
        path.unlink(missing_ok=True)
        # this lock's writers are its holders, all gone now but us: a temp file of it is a torn write (a second
        # Ctrl-C ends a rank at once); other locks' temp files may be live writes (a filesystem without flock)
        for torn in path.parent.glob(f".{path.name}.*.tmp"):
            torn.unlink(missing_ok=True)
        if os.listdir(path.parent) != [GUARD]:
            return  # another run's lock: the folder stays
        (path.parent / GUARD).unlink(missing_ok=True)  # whoever waits on it retries on a fresh guard
        with contextlib.suppress(OSError):  # only when empty: no run's files
            path.parent.rmdir()
            if path.parent.parent in _made_here:
                path.parent.parent.rmdir()


def _checked_paths(output_dir: str | Path, run: str, log_dir: str | Path | None = None) -> list[Path]:
    """The run's lock beside its checkpoints, and one beside its logs when they live elsewhere: two runs of one
    name with different --output-dir but one --log-dir would otherwise write one training.log."""
    paths = []
    for folder, flag in ((output_dir, "--output-dir"), (log_dir, "--log-dir")):
        if folder is None:
            continue
        check_writable_dir(folder, flag)  # one line for a path under a file or a read-only place
        path = lock_path(folder, run)
        if any(os.path.abspath(path) == os.path.abspath(p) for p in paths):
            continue
        if not Path(folder).exists():
            _made_here.add(Path(folder))
        paths.append(path)
    return paths


@contextlib.contextmanager
def holding(output_dir: str | Path, run: str, role: str, log_dir: str | Path | None = None):
    """This process holds the run's locks inside the block (joins its launcher's, or takes them)."""
    with contextlib.ExitStack() as held:
        for path in _checked_paths(output_dir, run, log_dir):
            me = hold(path, run, role)
            held.callback(release, path, me)
        yield


def hold_for_run(cleanup: contextlib.ExitStack, output_dir: str | Path, run: str, accelerator,
                 log_dir: str | Path | None = None) -> None:
    """Every process of the run holds the lock until `cleanup` closes: each machine's main process first (it may
    take a free one), then the others join. A refusal on any machine reaches every rank."""
    from utils.distributed import all_gather_object

    role = f"rank {accelerator.process_index}"
    refusal = None
    if accelerator.is_local_main_process:
        try:
            cleanup.enter_context(holding(output_dir, run, role, log_dir))
        except PiconeoxError as e:
            refusal = str(e)
    if refusal := next((r for r in all_gather_object(refusal) if r), None):
        raise PiconeoxError(refusal)
    if not accelerator.is_local_main_process:
        cleanup.enter_context(holding(output_dir, run, role, log_dir))


@contextlib.contextmanager
def for_launcher(output_dir: str | Path, run: str, log_dir: str | Path | None = None):
    """start_training.sh's preflight: take the locks in the launcher's name (`OWNER_ENV`) and tell the launcher
    where they are (`NOTE_ENV`, one per line), which releases them on exit; given back at once if the block refuses
    the run. Without the launcher (a bare --preflight) nothing is locked."""
    if not os.environ.get(OWNER_ENV, "").isdigit():
        yield
        return
    taken = []
    try:
        for path in _checked_paths(output_dir, run, log_dir):
            taken.append((path, hold(path, run, "start_training.sh", pid=int(os.environ[OWNER_ENV]))))
        yield
    except BaseException:
        for path, me in taken:
            release(path, me)
        raise
    if os.environ.get(NOTE_ENV):
        Path(os.environ[NOTE_ENV]).write_text("\n".join(os.path.abspath(path) for path, _ in taken))


def main(argv: list[str]) -> int:
    """`python -m utils.run.runlock release PATHS PID`: start_training.sh's exit path (the locks its preflight
    took; PATHS is the note's text, one lock file per line)."""
    if len(argv) != 3 or argv[0] != "release" or not argv[2].isdigit():
        print("usage: python -m utils.run.runlock release LOCK_FILE LAUNCHER_PID", file=sys.stderr)
        return 2
    pid = int(argv[2])
    for path in map(Path, filter(None, argv[1].splitlines())):
        for holder in _read(path):
            if holder.pid == pid and holder.host == socket.gethostname():
                release(path, holder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
