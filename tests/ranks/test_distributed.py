"""Multi-process training on CPU (gloo DDP through `accelerate launch`), as on a multi-GPU box."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.ranks import TINY, kill_tree, launch
from utils.ckpt.format import MARKER, check_complete, step_dir_name, step_folders


def test_each_rank_joins_and_parameters_stay_identical(tmp_path):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
           str(REPO / "tests" / "support" / "ddp_probe.py")]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=bound(150))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["world_size"] == 2
    a, b = report["checksums"]
    assert a == pytest.approx(b, abs=1e-9)


@pytest.fixture(scope="module")
def two_and_one(tmp_path_factory, tiny_data):
    """The same global batch (8 blocks) as 2 processes x 4 and as 1 process x 8."""
    two, one = tmp_path_factory.mktemp("two"), tmp_path_factory.mktemp("one")
    losses2, proc2 = launch(two, tiny_data, 2, 4)
    losses1, _ = launch(one, tiny_data, 1, 8)
    return {"two": (two, losses2, proc2), "one": (one, losses1)}


def test_two_processes_match_one_with_the_same_global_batch(two_and_one):
    _, losses2, proc2 = two_and_one["two"]
    _, losses1 = two_and_one["one"]
    assert "2 training process(es) under accelerate launch" in proc2.stdout and "2 process(es)" in proc2.stderr
    assert len(losses2) == len(losses1) == 12
    assert max(abs(a - b) for a, b in zip(losses2, losses1)) < 1e-4  # gloo all-reduce order vs one sum


def test_only_the_main_process_writes(two_and_one):
    two, _, proc2 = two_and_one["two"]
    log = (two / "logs" / "run" / "training.log").read_text()
    assert "2 process(es)" in log
    assert log.count("step 6: train loss") == 1
    assert len(list((two / "logs" / "run").glob("events.out.tfevents*"))) == 1
    assert [s for s, _ in step_folders(two / "ckpt" / "run")] == [6, 12]


@pytest.mark.parametrize("first,then", [("two", 1), ("one", 2)])
def test_resume_across_world_sizes_keeps_the_data_position(two_and_one, tiny_data, tmp_path, first, then):
    """Resume a 2-process run on 1 process and a 1-process run (micro batch 8) on 2, with micro batch 4: the
    checkpoint's 8 blocks per step are kept (accumulation 2 and 1): same losses, same tokens seen."""
    src = two_and_one[first][0] / "ckpt" / "run" / "step-00000006"
    losses, proc = launch(tmp_path, tiny_data, then, 4, "--resume", str(src))
    assert f"global batch 256 tokens per step = micro batch 4 x {2 // then} accumulation" in proc.stderr
    straight = two_and_one[first][1]
    assert len(losses) == 12  # steps 1-6 from the checkpoint's history, 7-12 resumed
    assert max(abs(a - b) for a, b in zip(losses[6:], straight[6:])) < 1e-4
    final = json.loads((tmp_path / "ckpt" / "run" / "final" / "trainer.json").read_text())
    assert final["tokens_seen"] == 12 * 8 * 32
    loader = json.loads((tmp_path / "ckpt" / "run" / "final" / "loader.json").read_text())
    assert loader["blocks_consumed"] == 12 * 8 or loader["epoch"] > 0


@pytest.fixture(scope="module")
def fsdp_config_gs_data(tmp_path_factory, tiny_data, _emulator_process):
    """One launch for the two tests below: 2 processes, 2 steps, the production FSDP config on CPU (without
    PICONEOX_CPU_FSDP) and --data gs:// (a copy of tiny_data in the GCS emulator). (work folder, bucket, process)"""
    from tests.support.gcs_servers import use_server
    from utils.storage import open_storage
    from utils.storage.sync import upload_tree

    host, server = _emulator_process
    server.wipe()
    work = tmp_path_factory.mktemp("gs-fsdp")
    with pytest.MonkeyPatch.context() as mp:
        gcs = use_server(host, mp, "piconeox-test")
        upload_tree(tiny_data, open_storage(gcs.url("data/tiny"), timeout_s=5), progress=False)
        cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", "2",
               "--accelerate-config", str(REPO / "configs" / "accelerate" / "fsdp_production.yaml"), "--data",
               gcs.url("data/tiny"), "--", *TINY, "--batch-size", "4", "--max-steps", "2", "--run-name", "run",
               "--output-dir", str(work / "ckpt"), "--log-dir", str(work / "logs")]
        env = {k: v for k, v in os.environ.items() if k != "PICONEOX_CPU_FSDP"}
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=bound(150),
                              env={**env, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, gcs.bucket, proc


def test_fsdp_config_on_cpu_falls_back_to_data_parallel(fsdp_config_gs_data):
    """FSDP needs CUDA: on CPU the production FSDP config still trains (gloo DDP) and says so."""
    work, _, proc = fsdp_config_gs_data
    assert "FSDP needs CUDA; this run uses plain data parallelism on the CPU" in proc.stderr
    assert check_complete(work / "ckpt" / "run" / "final") is None


def test_two_machines_resume_auto_from_the_same_step_after_one_disk_is_wiped(two_and_one, tiny_data, tmp_path):
    """Two machines (own working dirs, one process each, loopback, a local folder as the bucket): both killed,
    the bucket's newest marker lost, machine 1's disk wiped, `--resume auto` on both: rank 0 picks a step that
    machine 1 can get too, and both fetch exactly that one."""
    _, straight, _ = two_and_one["two"]  # the same global batch on one machine, uninterrupted
    bucket = tmp_path / "bucket"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def machines(*extra) -> list[subprocess.Popen]:
        procs = []
        for rank in (0, 1):
            cwd = tmp_path / f"machine{rank}"
            cwd.mkdir(exist_ok=True)
            cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--num-machines", "2",
                   "--machine-rank", str(rank), "--main-process-ip", "127.0.0.1", "--main-process-port", str(port),
                   "--data", str(tiny_data), "--", *TINY, "--batch-size", "4", "--run-name", "run",
                   "--checkpoint-bucket", str(bucket), *extra]
            procs.append(subprocess.Popen(cmd, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
        return procs

    def bucket_step() -> int:
        return max((int(p.parent.name[5:]) for p in (bucket / "run").glob("step-*/COMPLETE")), default=0)

    # Synchronous saves every step make the run slow enough to be killed half-way at a known point.
    procs = machines("--save-every", "1", "--no-background-upload")
    deadline = time.monotonic() + bound(120)
    while bucket_step() < 5:
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, procs[0].stderr.read()[-3000:]
        time.sleep(0.02)
    for p in procs:
        kill_tree(p.pid)
    for p in procs:
        p.communicate()
    newest = bucket_step()
    assert newest < 12, "finished before it was killed"
    # The newest upload was cut before its marker: only machine 0's disk has that step complete.
    (bucket / "run" / step_dir_name(newest) / MARKER).unlink()
    shutil.rmtree(tmp_path / "machine1" / "checkpoints")

    procs = machines("--resume", "auto")
    outs = [p.communicate(timeout=bound(150)) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    log = (tmp_path / "machine0" / "logs" / "run" / "training.log").read_text()
    step = int(log.split("at step ")[1].split()[0])
    assert step == newest - 1  # the newest step that both machines can get
    # machine 1 had nothing left: it fetched exactly rank 0's step from the bucket
    assert [p.name for p in (tmp_path / "machine1" / "checkpoints" / ".remote-cache").rglob("step-*")] == \
        [step_dir_name(step)]
    history = json.loads((tmp_path / "machine0" / "logs" / "run" / "history.json").read_text())
    assert [r["train/loss"] for r in history if "train/loss" in r] == straight


def test_launcher_syncs_gs_data_once_per_machine_before_the_launch(fsdp_config_gs_data):
    """--data gs://: start_training.sh syncs it into this host's cache before `accelerate launch`, outside any
    process group, and both ranks read that folder (train.py refuses to sync with more than one process)."""
    work, bucket, proc = fsdp_config_gs_data
    local = f"data/gcs-cache/{socket.gethostname()}/{bucket}/data/tiny"
    assert f"data synced to {local}\n" in proc.stdout
    assert "2 training process(es) under accelerate launch" in proc.stdout
    assert f"data {local} (vocab 256" in (work / "logs" / "run" / "training.log").read_text()
    assert (work / local / "manifest.json").is_file()
