"""SIGTERM to every process of a run at once (what systemd and Slurm's scancel send) on a starved box: the test
preset on two ranks at nice 10 beside four busy loops, each rank left ~5% of a core (tests/support/stop_cost.py
makes nice count across sessions, as on a server). The stop saves its step within the default grace of 30 s and
exits 0, every round. Before, the stop's save ran on the saver thread at nice +10 more, a loss plot was drawn and
one more step trained: `the clean stop did not finish within --grace-seconds 30 (a peer process is gone or
stuck)`, exit 1, and no checkpoint at all.

The runs start together on the free box and wait there stopped (SIGSTOP); each stop is then made alone, one after
the other, beside the busy loops."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.loaded import carry_on, kill_leftovers, paused
from tests.support.stop_cost import BUSY_LOOPS, ready, sigterm_all
from utils.ckpt.format import check_complete, read_marker, step_dir_name

ROUNDS = 3


@pytest.fixture(scope="module")
def stops(tmp_path_factory, tiny_data) -> list:
    root = tmp_path_factory.mktemp("starved")

    def started(r: int):
        proc = ready(root / f"round-{r}", tiny_data, 2)
        return proc, paused(proc)

    try:
        with ThreadPoolExecutor(ROUNDS) as pool:
            runs = list(pool.map(started, range(ROUNDS)))
        results = []
        for r, (proc, pids) in enumerate(runs):
            carry_on(pids)
            results.append((root / f"round-{r}", sigterm_all(root / f"round-{r}", proc, BUSY_LOOPS)))
        return results
    finally:
        kill_leftovers()


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_sigterm_to_every_process_on_a_starved_box_saves_within_the_grace(stops, round_):
    work, stop = stops[round_]
    text = stop.text
    assert stop.code == 0 and stop.marker_s is not None, (stop.code, text[-3000:])
    assert "Traceback" not in text and "error:" not in text, text[-3000:]
    step = int(text.split("SIGTERM received: saving step ")[1].split()[0])
    folder = work / "ckpt" / "r" / step_dir_name(step)
    assert check_complete(folder) is None and read_marker(folder)["world_size"] == 2  # both ranks' shards
