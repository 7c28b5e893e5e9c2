"""What a clean stop costs: SIGTERM to every process of a run at once (as systemd and Slurm's scancel signal a job),
and the CPU seconds its processes spend from that signal to the COMPLETE marker of the step it saves and to their
exit, on an idle box or at nice 10 beside busy loops. The machinery of benchmarks/bench_stops.py and of
tests/loaded/test_stop_cost.py."""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.chaos import training_argv, tree
from tests.support.loaded import STARTED, busy_loops, kill_leftovers, output, training, wait_for
from tests.support.paths import REPO
from utils.ckpt.format import MARKER, step_dir_name

BUSY_LOOPS = 4  # beside them a run at nice 10 gets ~5% of a core on two cores
TICK = os.sysconf("SC_CLK_TCK")


def nice_everywhere(family: list[tuple[int, int]], nice: int = 10) -> None:
    """Give the autogroup of each training process (torchrun starts each in a session of its own) the nice value
    `nice`: Linux schedules sessions, not processes, against each other under autogroup (its default on desktops
    and here), so a process's own nice counts only inside its session; a server kernel or a systemd slice weighs
    every process by its nice. This makes the box the second kind for the run's ranks: beside four busy loops of
    their own sessions they get ~5% of a core."""
    for pid, _ in family:
        if training_argv(pid):
            with contextlib.suppress(OSError):  # gone meanwhile, or a kernel without autogroup: nice holds as it is
                Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def role(pid: int) -> str:
    """What `pid` is in a run: "rank N", "launcher", "supervisor" (start_training.sh), or its program's name."""
    argv = training_argv(pid)
    if argv:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        return "rank " + next((e[5:].decode() for e in env if e.startswith(b"RANK=")), "0")
    with contextlib.suppress(OSError):
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        return next((name for key, name in (("supervise.py", "supervisor"), ("launch.py", "launcher"),
                                            ("lifeline", "launcher")) if key in cmd), Path(cmd.split("\0")[0]).name)
    return str(pid)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds `pid` and the children it has reaped (the preflight, its shell's checks) have used
    (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(f) for f in fields[11:15]) / TICK


def children_cpu() -> float:
    """CPU seconds of this process's reaped descendants (a run's whole tree, once its script is reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start(work: Path, data: Path, procs: int, *extra: str) -> subprocess.Popen:
    """./start_training.sh --config test (the preset as it is) at nice 10, its output in work/out."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = ["nice", "-n", "10", str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs",
           str(procs), "--data", str(data), "--max-steps", "100000", "--", "--output-dir", str(work / "ckpt"),
           "--log-dir", str(work / "logs"), "--run-name", "r", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PICONEOX_", "OMP_NUM_THREADS"))}
    with open(work / "out", "w") as out:  # a file: an unread pipe would fill up and block the run
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**env, "PICONEOX_FAKE_GPUS": "0"},
                                start_new_session=True)
    STARTED.append(proc)
    return proc


def saved_marker(work: Path) -> bool:
    """The step the stop saves ("SIGTERM received: saving step N") has its COMPLETE marker."""
    said = output(work).partition(" received: saving step ")[2].split(" ", 1)[0]
    return said.isdigit() and (work / "ckpt" / "r" / step_dir_name(int(said)) / MARKER).exists()


@dataclass
class StopCost:
    """One stop: its exit code, seconds (wall and CPU of the run's processes) from the signal to the new COMPLETE
    marker (None: none came) and to the end of the run, and the run's output."""
    code: int
    marker_s: float | None
    marker_cpu_s: float | None
    exit_s: float
    exit_cpu_s: float | None
    text: str
    by_process: dict[str, tuple[float, float]]  # CPU seconds from the signal to the marker and to its last sight,
    # per process ("rank 0", "launcher", "supervisor")


def ready(work: Path, data: Path, procs: int, grace: float = 30, *extra: str) -> subprocess.Popen:
    """The test preset on `procs` ranks at nice 10 (`start`) with --grace-seconds `grace`, once every rank trains."""
    proc = start(work, data, procs, "--grace-seconds", f"{grace:g}", *extra)
    wait_for(f"{procs} rank(s) training", lambda: training(work, procs), proc)
    return proc


def sigterm_all(work: Path, proc: subprocess.Popen, busy: int, children_before: float | None = None) -> StopCost:
    """With `busy` loops spinning, SIGTERM to every process of the run `proc` at once; the stop measured until it
    ends. The CPU to its end is read from this process's reaped children, counted from `children_before`
    (children_cpu() before the run started; None: not measured, as when other runs end meanwhile)."""
    family = tree(proc.pid)
    nice_everywhere(family)
    with busy_loops(busy, own_sessions=True):
        used = {pid: cpu_seconds(pid) or 0.0 for pid, _ in family}
        before_signal, names, marked = dict(used), {pid: role(pid) for pid, _ in family}, {}
        at_signal, t0 = sum(used.values()), time.monotonic()
        for pid, _ in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        marker_s = marker_cpu = None
        while proc.poll() is None:
            for pid in used:
                used[pid] = max(used[pid], cpu_seconds(pid) or 0.0)
            if marker_s is None and saved_marker(work):
                marker_s, marker_cpu, marked = time.monotonic() - t0, sum(used.values()) - at_signal, dict(used)
            time.sleep(0.05)
        exit_s = time.monotonic() - t0
        if marker_s is None and saved_marker(work):  # written in the last poll's interval
            marker_s, marker_cpu = exit_s, sum(used.values()) - at_signal
        total = None if children_before is None else children_cpu() - children_before - at_signal  # before the
        # busy loops are reaped
    by_process = {f"{name} {pid}": (marked.get(pid, used[pid]) - before_signal[pid], used[pid] - before_signal[pid])
                  for pid, name in names.items()}
    return StopCost(proc.returncode, marker_s, marker_cpu, exit_s, total, output(work), by_process)


def stop_cost(work: Path, data: Path, procs: int, busy: int, grace: float = 30, *extra: str) -> StopCost:
    """One run started, trained and stopped (`ready`, then `sigterm_all`), alone: its CPU to the end is measured."""
    before = children_cpu()
    try:
        return sigterm_all(work, ready(work, data, procs, grace, *extra), busy, before)
    finally:
        kill_leftovers()
