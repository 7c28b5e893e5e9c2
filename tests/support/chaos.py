"""Runs of ./start_training.sh killed in a chosen phase (SIGKILL of the whole tree or the launcher alone), and
what an uninterrupted run left: the machinery of benchmarks/chaos_lifecycle.py and of the tests that kill runs."""
from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

from tests.support.paths import REPO
from utils.ckpt.format import MARKER, WEIGHTS_FILE, check_complete, latest_complete, step_folders
from utils.run.runlock import start_time

TINY = ["--set", "model.num_layers=1", "--set", "model.hidden_size=32", "--set", "model.num_heads=4", "--set",
        "model.intermediate_size=64", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "2", "--lr", "3e-3",
        "--log-every", "1", "--eval-every", "20", "--save-every", "5"]
PHASES = ("startup", "training", "save", "upload")
GRACE = 20


def launch(work: Path, data: Path, procs: int, steps: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", str(procs),
           "--data", str(data),
           "--resume", "auto", "--max-steps", str(steps), "--", *TINY, "--output-dir", str(work / "ckpt"),
           "--log-dir", str(work / "logs"), "--run-name", "r", "--checkpoint-bucket", str(work / "bucket"),
           "--grace-seconds", str(GRACE), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PICONEOX_")}
    env.update(PICONEOX_FAKE_GPUS="0", NO_GCE_CHECK="true", GCE_METADATA_HOST="127.0.0.1:9")
    out = open(work / "attempts.log", "a")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def tree(root: int) -> list[tuple[int, int]]:
    """(pid, start time) of `root` and all its descendants (torchrun's workers sit in sessions of their own)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier]
        found += frontier
    return [(pid, start) for pid in found if (start := start_time(pid)) is not None]


def alive(procs: list[tuple[int, int]]) -> list[int]:
    return [pid for pid, start in procs if start_time(pid) == start]


def training_argv(pid: int) -> list[str] | None:
    """`pid`'s command line when it is a training process (`python [-u] train.py ...`), else None: the preflight
    check, the launcher and the supervisor name train.py in theirs too."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # gone meanwhile
        return None
    script = next((arg for arg in argv[1:] if arg and not arg.startswith("-")), "")
    return argv if script.endswith("train.py") and "--preflight" not in argv else None


def pause(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)


def carry_on(pids: list[int]) -> None:
    """SIGCONT to each of `pids` that is still there."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def phase(work: Path, procs: int, since: float) -> str:
    """What the attempt started at `since` (time.time()) is doing now, read from its files."""
    run, bucket = work / "ckpt" / "r", work / "bucket" / "r"
    try:
        holders = (work / "ckpt" / ".locks" / "r.lock").read_text().count('"rank ')
        steps = [(folder, folder.stat().st_mtime) for _, folder in step_folders(run)]
    except FileNotFoundError:
        return "startup"
    if holders < procs or not any(mtime >= since for _, mtime in steps):
        return "startup"  # until every rank holds the lock and this attempt has written a step
    if any(mtime >= since and check_complete(folder) is not None for folder, mtime in steps):
        return "save"
    local = latest_complete(run)
    fresh = local and (local / MARKER).stat().st_mtime >= since
    if fresh and check_complete(bucket / local.name) is not None:
        return "upload"  # written here, not complete in the bucket yet
    return "training"


def kill_attempt(work: Path, proc: subprocess.Popen, procs: int, target: str, whole_tree: bool,
                 rng: random.Random) -> dict:
    """Wait for `target` (at most 300 s), then SIGKILL; returns what happened."""
    deadline, since = time.monotonic() + 300, time.time()
    start_by = time.monotonic() + rng.uniform(1, 6)
    now, trained_since = "startup", None
    while proc.poll() is None and time.monotonic() < deadline:
        now = phase(work, procs, since)
        if now != "startup" and trained_since is None:
            trained_since = time.monotonic()
        if (target == "startup" and time.monotonic() > start_by) or (target != "startup" and now == target):
            break
        if trained_since is not None and time.monotonic() - trained_since > 15:
            break  # the target phase did not come up: kill in whatever phase this is
        time.sleep(0.005)
    if proc.poll() is not None:
        return {"target": target, "hit": "finished", "rc": proc.returncode}
    procs = tree(proc.pid)
    killed = time.monotonic()
    for pid, _ in (procs[::-1] if whole_tree else procs[:1]):
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    while (left := alive(procs)) and time.monotonic() - killed < GRACE + 30:
        time.sleep(0.05)
    quiet = time.monotonic() - killed
    return {"target": target, "hit": now, "mode": "tree" if whole_tree else "launcher", "processes": len(procs),
            "quiet_s": round(quiet, 2), "left": left, "pids": procs}


def finish(work: Path, data: Path, procs: int, steps: int, extra: tuple[str, ...] = ()) -> tuple[int, int]:
    """Run with --resume auto until it exits 0; (attempts refused by the lock, seconds)."""
    refused, start = 0, time.monotonic()
    while True:
        proc = launch(work, data, procs, steps, extra)
        if proc.wait() == 0:
            return refused, time.monotonic() - start
        tail = (work / "attempts.log").read_text().splitlines()[-1:]
        if proc.returncode == 2 and tail and "still being written by" in tail[0]:
            refused += 1
            time.sleep(1)
            continue
        raise SystemExit(f"an attempt failed with exit {proc.returncode}: {tail}")


def final_weights(work: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(work / "ckpt" / "r" / "final" / WEIGHTS_FILE)


def losses(work: Path) -> dict[int, float]:
    history = json.loads((work / "logs" / "r" / "history.json").read_text())
    return {h["step"]: h["train/loss"] for h in history if "train/loss" in h}
