"""How soon the bounded stops end: the timing goals the tests no longer assert (a test waits for the event; a busy
CI box stretches every wall-clock number, so the numbers live here, measured on a quiet box).

    .venv/bin/python benchmarks/bench_stops.py [--rounds 3]

1. A GCS call to a dead server with --storage timeout 1.5 s: the error after (goal) <= 2x that deadline.
2. No Google Cloud credentials: the one-line error (goal) within 1 s, with no connection tried.
3. A clean stop whose peer hangs inside the all-reduce (--grace-seconds 3): rank 0 exits (goal) within the grace
   plus 2 s.
4. The stop's own cost (`--cost`): SIGTERM to every process of the test preset (nice 10, --procs N) as systemd or
   scancel send it, idle and beside four busy loops; CPU seconds of the run's processes from the signal to the
   COMPLETE marker of the step it saves and to their exit (CPU, not wall: the same on a busy box), and whether it
   ended 0 within --grace-seconds 30. At nice 10 beside four loops on two cores a run gets ~5% of a core: 30 s of
   grace is ~1.5 CPU seconds per rank.

    .venv/bin/python benchmarks/bench_stops.py --cost [--procs 2] [--rounds 3]
"""
from __future__ import annotations

import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_GCE_CHECK", "true")  # never probe a cloud metadata server
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.bounds import bound  # noqa: E402
from tests.support.ranks import STUCK_PEER, start_two_ranks  # noqa: E402
from tests.support.stop_cost import BUSY_LOOPS, stop_cost  # noqa: E402
from tests.support.waits import process_state, wait_for  # noqa: E402
from utils.errors import CliParser, PiconeoxError, at_least, cli  # noqa: E402
from utils.storage import open_storage  # noqa: E402
from utils.storage.base import StorageError  # noqa: E402

DEAD_SERVER_TIMEOUT_S, GRACE_S = 1.5, 3.0


def dead_server() -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    store = open_storage("gs://some-bucket/data", timeout_s=DEAD_SERVER_TIMEOUT_S)
    start = time.monotonic()
    try:
        store.list()
    except StorageError:
        return time.monotonic() - start
    raise SystemExit("a dead server answered")


def no_credentials() -> float:
    os.environ.pop("STORAGE_EMULATOR_HOST", None)
    os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    with tempfile.TemporaryDirectory() as empty:
        os.environ["CLOUDSDK_CONFIG"] = empty
        start = time.monotonic()
        try:
            open_storage("gs://some-bucket/data")
        except PiconeoxError:
            return time.monotonic() - start
    raise SystemExit("found credentials: run it where there are none")


def stuck_peer() -> float:
    procs = start_two_ranks(STUCK_PEER)
    try:
        assert procs[1].stdout.readline() == "stuck\n"
        wait_for("rank 1 to be stopped", lambda: process_state(procs[1].pid) == "T", timeout=bound(60))
        procs[0].send_signal(signal.SIGTERM)
        start = time.monotonic()
        procs[0].communicate(timeout=bound(60))
        return time.monotonic() - start
    finally:
        for p in procs:
            p.kill()
            p.wait()


def stop_costs(procs: int, rounds: int) -> None:
    from utils.data.prepare import prepare

    print(f"{'stop of the test preset, --procs ' + str(procs):40} {'code':>4} {'to marker: s':>12} {'CPU s':>6} "
          f"{'to exit: s':>10} {'CPU s':>6}  load before")
    with tempfile.TemporaryDirectory() as tmp:
        data = prepare(["demo"], name="demo", out_dir=Path(tmp), tokenizer="byte", workers=1, dataset_percent=5)
        for busy in (0, BUSY_LOOPS):
            for r in range(rounds):
                load = os.getloadavg()[0]
                c = stop_cost(Path(tmp) / f"run-{busy}-{r}", data, procs, busy)
                name = "idle" if not busy else f"nice 10 beside {busy} busy loops"
                marker = f"{c.marker_s:12.1f} {c.marker_cpu_s:6.2f}" if c.marker_s is not None else f"{'none':>19}"
                print(f"{name:40} {c.code:4d} {marker} {c.exit_s:10.1f} {c.exit_cpu_s:6.2f}  {load:.1f}", flush=True)
                print("    CPU s to the marker: " + ", ".join(f"{who.rsplit(' ', 1)[0]} {m:.2f}"
                                                      for who, (m, _) in c.by_process.items()))
                if c.code != 0:
                    print("    " + "\n    ".join(c.text.strip().splitlines()[-4:]))


@cli
def main(argv=None) -> None:
    ap = CliParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=at_least(1), default=3)
    ap.add_argument("--cost", action="store_true", help="measure the stop's own cost instead (item 4)")
    ap.add_argument("--procs", type=at_least(1), default=2, help="--cost: training processes")
    args = ap.parse_args(argv)
    if args.cost:
        return stop_costs(args.procs, args.rounds)
    rows = [("dead GCS server (timeout 1.5 s)", dead_server, 2 * DEAD_SERVER_TIMEOUT_S),
            ("no credentials", no_credentials, 1.0),
            ("stop with a hung peer (grace 3 s)", stuck_peer, GRACE_S + 2)]
    print(f"{'case':36} {'median s':>9} {'max s':>7} {'goal s':>7}")
    for name, measure, goal in rows:
        times = [measure() for _ in range(args.rounds)]
        verdict = "ok" if max(times) <= goal else "OVER"
        print(f"{name:36} {statistics.median(times):9.2f} {max(times):7.2f} {goal:7.1f}  {verdict}")


if __name__ == "__main__":
    main()
