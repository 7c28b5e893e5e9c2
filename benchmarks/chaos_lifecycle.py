"""Chaos test of a run's lifetime: random SIGKILLs, then the final weights must equal an uninterrupted run's.

For each process count, through the real ./start_training.sh (gloo on CPU, a directory as --checkpoint-bucket):
1. an uninterrupted reference run of --steps steps;
2. --kills attempts, each started with --resume auto and SIGKILLed in a target phase (startup, training, save,
   upload; the phase actually hit is recorded), alternately the whole process tree at once (a machine that loses
   power) and the launcher alone (a supervisor, the OOM killer): then every process of the run must end within
   the grace, and a restart while the old one still saves must be refused (exit 2) until it is done;
3. a last attempt runs to the end. Its final weights must be bit-identical to the reference's, its logged
   losses equal, and no process of any attempt may be left.

    .venv/bin/python benchmarks/chaos_lifecycle.py --procs 2 1 --kills 8 --steps 400
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from utils.ckpt.format import MARKER, WEIGHTS_FILE, check_complete, latest_complete, step_folders  # noqa: E402
from utils.errors import CliParser, at_least, cli  # noqa: E402
from utils.run.runlock import start_time  # noqa: E402

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


def chaos(procs: int, kills: int, steps: int, data: Path, root: Path, rng: random.Random) -> dict:
    import torch

    ref, work = root / f"ref-{procs}", root / f"chaos-{procs}"
    ref.mkdir()
    work.mkdir()
    t0 = time.monotonic()
    finish(ref, data, procs, steps)
    reference_s = time.monotonic() - t0
    events, refused, pids = [], 0, []
    while len(events) < kills:
        i = len(events)
        proc = launch(work, data, procs, steps)  # at once: the previous attempt's processes may still be saving
        whole_tree = (i // len(PHASES)) % 2 == 0  # four phases with the whole tree, then four with the launcher
        event = kill_attempt(work, proc, procs, PHASES[i % len(PHASES)], whole_tree=whole_tree, rng=rng)
        if event["hit"] == "finished":
            if event["rc"] == 2 and "still being written by" in (work / "attempts.log").read_text().splitlines()[-1]:
                refused += 1  # refused before the launch, in one line: try again
                time.sleep(1)
                continue
            raise SystemExit(f"attempt {i} ended with exit {event['rc']} before its kill: see {work}/attempts.log")
        pids += event.pop("pids")
        events.append(event)
        print(json.dumps({"procs": procs, **event}), flush=True)
    more, finish_s = finish(work, data, procs, steps)
    refused += more
    ref_w, got_w = final_weights(ref), final_weights(work)
    identical = ref_w.keys() == got_w.keys() and all(torch.equal(ref_w[k], got_w[k]) for k in ref_w)
    takeovers = (work / "attempts.log").read_text().count("taking over the lock")
    hits = dict(Counter(f"{e['mode']}/{e['hit']}" for e in events))
    return {"procs": procs, "kills": len(events), "stale_lock_takeovers": takeovers, "hits": hits,
            "refused_restarts": refused, "max_quiet_after_launcher_kill_s": max(
                (e["quiet_s"] for e in events if e.get("mode") == "launcher"), default=None),
            "left_after_kill": sum(len(e.get("left", [])) for e in events), "left_at_end": len(alive(pids)),
            "weights_bit_identical": identical, "losses_equal": losses(ref) == losses(work),
            "reference_s": round(reference_s, 1), "chaos_total_s": round(time.monotonic() - t0 - reference_s, 1),
            "finish_s": round(finish_s, 1)}


@cli
def main(argv=None) -> int:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=at_least(1), nargs="+", default=[1, 2])
    p.add_argument("--kills", type=at_least(0), default=8)
    p.add_argument("--steps", type=at_least(1), default=400)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from prepare_data import prepare

    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(tmp)
        data = prepare(["demo"], name="demo-byte-p5", out_dir=root / "data", tokenizer="byte", dataset_percent=5)
        rng = random.Random(args.seed)
        results = [chaos(n, args.kills, args.steps, data, root, rng) for n in args.procs]
    for r in results:
        print(json.dumps(r))
    ok = all(r["weights_bit_identical"] and r["losses_equal"] and not r["left_after_kill"] and not r["left_at_end"]
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
