"""kill -9 of a 2-process gloo run with the EMA of the weights on, at moments chosen by events: resumed bit for bit.

One run of ./start_training.sh --procs 2 (DDP, --resume auto) is killed three times, the whole process tree at
once (a machine losing power), each time in another moment: between saves (mid-step), while a save is in flight
(a step folder without its COMPLETE) and right after a checkpoint's COMPLETE appeared. Each
attempt after a kill resumes from the newest complete checkpoint and never from a half-written one; the last one
runs to the end. Its model weights, EMA weights and losses equal an uninterrupted run's of the same length.
benchmarks/chaos_lifecycle.py --procs 2 --ema kills at 8 random moments.
"""
import pytest

from tests.support import chaos
from tests.support.bounds import bound
from tests.support.ema_runs import EMA, assert_same_tensors
from tests.support.kill_moments import MOMENTS, kill_at, resumed_step
from utils.ckpt.format import check_complete, step_dir_name, step_folders
from utils.ckpt.load import read_weights

pytestmark = pytest.mark.usefixtures("one_thread")

PROCS, STEPS = 2, 40
RUN = (*EMA, "--save-every", "10")  # room between saves for the mid-step moment (each save takes about a second)


def test_kill_9_at_three_moments_of_two_ranks_resumes_to_identical_weights_and_ema(tmp_path, tiny_data):
    ref, work = tmp_path / "ref", tmp_path / "work"
    ref.mkdir()
    work.mkdir()
    chaos.finish(ref, tiny_data, PROCS, STEPS, RUN)
    attempts = work / "attempts.log"
    kills = []
    for moment in MOMENTS:  # the first, mid-step, leaves a checkpoint to resume from
        start = attempts.stat().st_size if attempts.exists() else 0
        kills.append(kill_at(work, chaos.launch(work, tiny_data, PROCS, STEPS, RUN), PROCS, moment, bound(240)))
        if len(kills) > 1:  # this attempt resumed from what the last kill left complete
            assert resumed_step(attempts.read_text()[start:]) == kills[-2]["complete"], kills
    save = kills[MOMENTS.index("save")]
    assert save["half_written"], kills  # the kill left a save half-written...
    start = attempts.stat().st_size
    chaos.finish(work, tiny_data, PROCS, STEPS, RUN)
    log = attempts.read_text()[start:]
    assert resumed_step(log) == kills[-1]["complete"] < STEPS, kills
    assert all(0 < k["complete"] < STEPS for k in kills), kills
    assert all(check_complete(folder) is None for _, folder in step_folders(work / "ckpt" / "r"))  # ...none is now

    assert chaos.losses(ref) == chaos.losses(work)
    last = step_dir_name(STEPS)
    a, b = ref / "ckpt" / "r" / last, work / "ckpt" / "r" / last
    assert_same_tensors(read_weights(a), read_weights(b))
    assert_same_tensors(read_weights(a, "ema"), read_weights(b, "ema"))
    assert_same_tensors(chaos.final_weights(ref), chaos.final_weights(work))  # final/: the EMA (best_final_weights)
