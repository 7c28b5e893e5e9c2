"""Chaos test of a run's lifetime: random SIGKILLs, then the final weights must equal an uninterrupted run's.

For each process count, through the real ./start_training.sh (gloo on CPU, a directory as --checkpoint-bucket):
1. an uninterrupted reference run of --steps steps;
2. --kills attempts, each started with --resume auto and SIGKILLed in a target phase (startup, training, save,
   upload; the phase actually hit is recorded), alternately the whole process tree at once (a machine that loses
   power) and the launcher alone (a supervisor, the OOM killer): then every process of the run must end within
   the grace, and a restart while the old one still saves must be refused (exit 2) until it is done;
3. a last attempt runs to the end. Its final weights must be bit-identical to the reference's, its logged
   losses equal, and no process of any attempt may be left. With --ema (train.ema_decay on, final/ holding the
   average) the last step's EMA and model weights must be bit-identical too.

    .venv/bin/python benchmarks/chaos_lifecycle.py --procs 2 1 --kills 8 --steps 400
    .venv/bin/python benchmarks/chaos_lifecycle.py --procs 2 --kills 8 --steps 400 --ema
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.chaos import PHASES, alive, final_weights, finish, kill_attempt, launch, losses  # noqa: E402
from utils.errors import CliParser, at_least, cli  # noqa: E402


def same_last_step(ref: Path, work: Path, steps: int, weights: str = "model") -> bool:
    """The last step checkpoints of both runs hold bit-identical `weights` ("model" or "ema")."""
    import torch

    from utils.ckpt.format import step_dir_name
    from utils.ckpt.load import read_weights

    a, b = (read_weights(w / "ckpt" / "r" / step_dir_name(steps), weights) for w in (ref, work))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def chaos(procs: int, kills: int, steps: int, data: Path, root: Path, rng: random.Random,
          extra: tuple[str, ...] = ()) -> dict:
    import torch

    ref, work = root / f"ref-{procs}", root / f"chaos-{procs}"
    ref.mkdir()
    work.mkdir()
    t0 = time.monotonic()
    finish(ref, data, procs, steps, extra)
    reference_s = time.monotonic() - t0
    events, refused, pids = [], 0, []
    while len(events) < kills:
        i = len(events)
        proc = launch(work, data, procs, steps, extra)  # at once: the previous attempt's processes may still be saving
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
    more, finish_s = finish(work, data, procs, steps, extra)
    refused += more
    ref_w, got_w = final_weights(ref), final_weights(work)
    identical = ref_w.keys() == got_w.keys() and all(torch.equal(ref_w[k], got_w[k]) for k in ref_w)
    takeovers = (work / "attempts.log").read_text().count("taking over the lock")
    hits = dict(Counter(f"{e['mode']}/{e['hit']}" for e in events))
    return {"procs": procs, "kills": len(events), "stale_lock_takeovers": takeovers, "hits": hits,
            "refused_restarts": refused, "max_quiet_after_launcher_kill_s": max(
                (e["quiet_s"] for e in events if e.get("mode") == "launcher"), default=None),
            "left_after_kill": sum(len(e.get("left", [])) for e in events), "left_at_end": len(alive(pids)),
            "weights_bit_identical": identical and same_last_step(ref, work, steps) and (
                not extra or same_last_step(ref, work, steps, "ema")), "losses_equal": losses(ref) == losses(work),
            "reference_s": round(reference_s, 1), "chaos_total_s": round(time.monotonic() - t0 - reference_s, 1),
            "finish_s": round(finish_s, 1)}


@cli
def main(argv=None) -> int:
    p = CliParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=at_least(1), nargs="+", default=[1, 2])
    p.add_argument("--kills", type=at_least(0), default=8)
    p.add_argument("--steps", type=at_least(1), default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ema", action="store_true", help="train.ema_decay=0.9, final/ holding the EMA: its weights must "
                   "resume bit for bit too")
    args = p.parse_args(argv)
    from prepare_data import prepare

    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        root = Path(tmp)
        data = prepare(["demo"], name="demo-byte-p5", out_dir=root / "data", tokenizer="byte", dataset_percent=5)
        rng = random.Random(args.seed)
        extra = ("--set", "train.ema_decay=0.9", "--set", "train.best_final_weights=ema") if args.ema else ()
        results = [chaos(n, args.kills, args.steps, data, root, rng, extra) for n in args.procs]
    for r in results:
        print(json.dumps(r))
    ok = all(r["weights_bit_identical"] and r["losses_equal"] and not r["left_after_kill"] and not r["left_at_end"]
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
