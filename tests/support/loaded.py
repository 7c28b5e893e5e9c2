"""A busy box for the stop tests: both cores taken by `yes` while a run started at nice 10 is signalled,
the start_training.sh runs those tests signal, and `all_at_once`, which makes every stop in one window of load."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.support.bounds import bound
from tests.support.chaos import TINY, alive, carry_on, pause, training_argv, tree
from tests.support.paths import REPO
from tests.support.ranks import kill_tree

ROUNDS = 2  # each stop is tried this many times on the loaded box: several, and few enough for the CI budget


@contextlib.contextmanager
def busy_loops(count: int, own_sessions: bool = False):
    """`count` `yes` processes spinning at the default priority for the duration (each in a session, an autogroup,
    of its own where `own_sessions`); killed and reaped after."""
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=own_sessions) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def both_cores_loaded():
    """One `yes` per core (at the default priority, in this session) for the duration; killed and reaped after."""
    return busy_loops(os.cpu_count() or 2)


def start(work: Path, data: Path, procs: int, *extra: str) -> subprocess.Popen:
    """./start_training.sh at nice 10 (as a user runs it beside other jobs), its output in work/out. Its grace only
    catches a hang: on a box loaded past both cores a clean stop's save took over the default 30 s."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = ["nice", "-n", "10", str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs",
           str(procs), "--data", str(data), "--max-steps", "100000", "--", *TINY, "--output-dir", str(work / "ckpt"),
           "--log-dir", str(work / "logs"), "--run-name", "r", "--grace-seconds", "600", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PICONEOX_", "OMP_NUM_THREADS"))}
    out = open(work / "out", "w")  # a file: an unread pipe would fill up and block the run
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**env, "PICONEOX_FAKE_GPUS": "0"},
                            start_new_session=True)
    STARTED.append(proc)
    return proc


STARTED: list[subprocess.Popen] = []  # the runs `start` began: a failed test kills what is left of them


def kill_leftovers() -> None:
    """SIGKILL every process of every run `start` began (each leads its own session), then forget them."""
    for proc in STARTED:
        kill_tree(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    STARTED.clear()


def output(work: Path) -> str:
    return (work / "out").read_text(errors="replace")


def wait_for(what: str, check, proc: subprocess.Popen, timeout: float | None = None):
    """Poll `check` until it returns something true; fails naming `what` if the run ends first or on a hang (past
    `timeout`, by default `bound(300)`)."""
    timeout = bound(300) if timeout is None else timeout
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"{what} not within {timeout:g} s"
        time.sleep(0.1)
    return result


def training(work: Path, procs: int) -> bool:
    """Every rank holds the run lock and a step was logged."""
    try:
        holders = (work / "ckpt" / ".locks" / "r.lock").read_text().count('"rank ')
    except FileNotFoundError:
        return False
    return holders >= procs and "loss=" in output(work)


def paused(proc: subprocess.Popen) -> list[int]:
    """Stop (SIGSTOP) the run's ranks while other runs get ready: ten ranks training at nice 10 for a minute took a
    core from the rest of the suite. `carry_on` continues them before their stop; the run never sees the pause."""
    pids = [pid for pid, _ in tree(proc.pid) if training_argv(pid)]
    pause(pids)
    return pids


def ended(proc: subprocess.Popen, family, timeout: float | None = None) -> tuple[int, list[int]]:
    """(exit code, pids of the run still alive once the launcher has exited) — every one should be gone. `timeout`:
    a hang bound, by default `bound(90)`."""
    code = proc.wait(timeout=bound(90) if timeout is None else timeout)
    return code, alive(family)


@dataclass
class Stop:
    """One stop of a loaded test: `ready(work, data)` starts its run on the free box and returns what `act` needs;
    `act(state)` makes the stop with both cores loaded and returns what its test checks."""
    ready: Callable
    act: Callable


@dataclass
class Failed:
    """A stop that raised (a wait that timed out, a run that ended early): its test raises `error`."""
    error: BaseException


def all_at_once(stops: dict[str, Stop], root: Path, data: Path) -> dict[str, object]:
    """Every stop's `ready` at once on the free box, then every `act` at once in one window of load: the other runs
    are the box's other jobs. Returns each stop's result, or Failed; nothing of any run is left."""
    def guarded(step: Callable, *args):
        try:
            return step(*args)
        except Exception as error:  # noqa: BLE001 - handed to the stop's own test
            return Failed(error)

    def act(name: str, state):
        return state if isinstance(state, Failed) else guarded(stops[name].act, state)

    try:
        with ThreadPoolExecutor(len(stops)) as pool:
            states = dict(zip(stops, pool.map(lambda name: guarded(stops[name].ready, root / name, data), stops)))
            with both_cores_loaded():
                return dict(zip(stops, pool.map(act, stops, states.values())))
    finally:
        kill_leftovers()


__all__ = ["ROUNDS", "Stop", "Failed", "all_at_once", "paused", "carry_on", "both_cores_loaded", "start", "output",
           "wait_for", "training", "ended", "tree"]
