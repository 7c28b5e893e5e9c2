"""Crashes do not leak storage: a run removes its partial steps (no COMPLETE marker) once a newer complete step
exists, locally and in the bucket, and keeps a partial newer than every complete step (it may be in flight)."""
import shutil

import pytest

from tests.support.training import run
from utils.ckpt.format import MARKER, manifest, step_dir_name, step_folders, write_marker
from utils.ckpt.bucket.remote import remote_steps
from utils.storage import open_storage

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")


def step_folder(run_dir, step: int, complete: bool):
    folder = run_dir / step_dir_name(step)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"shard")
    if complete:
        write_marker(folder, step, 1, manifest(folder, ["__0_0.distcp"]))
    return folder


def test_only_partials_older_than_the_newest_complete_step_go(tmp_path):
    from utils.ckpt.bucket.partials import remove_local

    for step, complete in ((10, True), (15, False), (20, True), (25, False)):
        step_folder(tmp_path, step, complete)
    assert remove_local(tmp_path) == [15]
    assert [step for step, _ in step_folders(tmp_path)] == [10, 20, 25]


def test_a_machine_holding_only_shards_follows_rank_0(tmp_path):
    """Its folders never have a marker (rank 0 writes them on its own disk): rank 0's complete steps decide."""
    from utils.ckpt.bucket.partials import remove_local

    for step in (10, 15, 20, 25):
        step_folder(tmp_path, step, complete=False)
    assert remove_local(tmp_path) == []  # without rank 0's word nothing is known complete: nothing goes
    assert remove_local(tmp_path, complete={10, 20}) == [15]
    assert [step for step, _ in step_folders(tmp_path)] == [10, 20, 25]


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_next_run_removes_partial_steps_of_crashed_attempts(tmp_path, tiny_data, request, where):
    """Complete 10 and 20, partial 15 and 25 (and 5 in the bucket) from killed attempts: the resumed run removes
    the older partials at its start in one INFO line, keeps 25 (newer than every complete step) until its own
    step 30 completes, then removes it too."""
    common = ("--save-every", "10", "--eval-every", "100", "--keep-last", "3", "--sample-prompt", "")
    bucket = None
    if where == "gcs":
        gcs = request.getfixturevalue("gcs_emulator")
        common += ("--checkpoint-bucket", gcs.url("ckpt"))
        bucket = open_storage(gcs.url("ckpt/run"))
    code, _, run_dir = run(tmp_path, tiny_data, "--max-steps", "20", *common)
    assert code == 0
    for step in (15, 25):  # a killed save: every file but the marker
        shutil.copytree(run_dir / "step-00000010", run_dir / step_dir_name(step))
        (run_dir / step_dir_name(step) / MARKER).unlink()
    if bucket:
        for step in (5, 15, 25):  # what a killed upload leaves in the bucket
            bucket.put(run_dir / "step-00000010" / "rng-00000.json", f"{step_dir_name(step)}/rng-00000.json")
        assert remote_steps(bucket) == {5: False, 10: True, 15: False, 20: True, 25: False}

    code, _, _ = run(tmp_path, tiny_data, "--max-steps", "30", "--resume", "auto", *common)
    assert code == 0
    assert [step for step, _ in step_folders(run_dir)] == [10, 20, 30]
    if bucket:
        assert remote_steps(bucket) == {10: True, 20: True, 30: True}
    log = (tmp_path / "logs" / "run" / "training.log").read_text().splitlines()
    removed = [line.partition(" INFO ")[2] for line in log if "removed partial checkpoint step(s)" in line]
    assert len(removed) == 2 and all(removed), removed  # each an INFO line
    at_start, after_30 = removed
    named = at_start.replace(str(run_dir), "RUN")  # the tmp path may hold "25" itself (pytest-251)
    assert "step(s) 15 from RUN" in named and "25" not in named
    assert "saved checkpoint" in after_30 and f"step(s) 25 from {run_dir}" in after_30
    if bucket:
        assert f"5, 15 from {bucket.url}" in at_start and f"25 from {bucket.url}" in after_30
