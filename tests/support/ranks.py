"""Several ranks and launcher runs: two gloo ranks of a script, ./start_training.sh with N processes, bounded runs
and whole-tree kills."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.support.bounds import bound
from tests.support.chaos import tree
from tests.support.paths import REPO

# train.py flags of the launcher tests (--config comes from the launcher)
TINY = ["--set", "model.num_layers=1", "--set", "model.hidden_size=32", "--set",
        "model.intermediate_size=64", "--seq-len", "32", "--log-every", "1", "--warmup-steps", "2",
        "--lr", "3e-3", "--max-steps", "12", "--save-every", "6", "--eval-every", "6"]
FSDP_CONFIG = str(REPO / "configs" / "accelerate" / "fsdp_production.yaml")


def run_bounded(cmd, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run in its own session; a hang past `timeout` kills every process of the run and fails."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"hung for more than {timeout:g} s: {' '.join(map(str, cmd))}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def launch(tmp_path, data, procs: int, micro_batch: int, *extra, fsdp: bool = False):
    """./start_training.sh --gpus 0 --procs N; returns (per-step losses, completed process).

    fsdp=True: the production FSDP2 config, really sharded over gloo (PICONEOX_CPU_FSDP=1, utils/run/accelerator.py).
    """
    config = ["--accelerate-config", str(REPO / "configs" / "accelerate" / "fsdp_production.yaml")] if fsdp else []
    cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", str(procs), *config,
           "--data", str(data), "--", *TINY, "--batch-size", str(micro_batch), "--run-name", "run",
           "--output-dir", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "logs"), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PICONEOX_CPU_FSDP": "1" if fsdp else "0"}
    proc = run_bounded(cmd, bound(150), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads((tmp_path / "logs" / "run" / "history.json").read_text())
    return [r["train/loss"] for r in history if "train/loss" in r], proc

# Two ranks in a stop vote, rank 1 stops itself (SIGSTOP) after printing "stuck": a SIGTERM to rank 0 then finds it
# inside the vote's all-reduce, and only the grace deadline (3 s) ends it (test_lifecycle, bench_stops).
STUCK_PEER = r"""
import os, signal, sys
import torch.distributed as dist
from accelerate import Accelerator
from utils.run.lifeline import GraceDeadline
from utils.run.preemption import StopRequest, StopVote

accelerator = Accelerator(cpu=True)
stop = StopRequest(3)
with GraceDeadline(stop), stop:
    vote = StopVote(stop, accelerator)
    for micro in range(10 ** 9):
        if accelerator.process_index == 1 and micro == 5:
            print("stuck", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)  # a peer that hangs: rank 0 waits in the vote's all-reduce
        vote()
"""


def start_two_ranks(script: str, *args: str) -> list[subprocess.Popen]:
    """`script` as two gloo ranks of one process group (rank 0 first), with piped text output."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        procs.append(subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it (torchrun starts its workers in sessions of their own), as a
    machine that is lost takes all of its processes at once."""
    for member, _ in tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def relative_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def machines(tmp_path, data, count: int, *extra) -> list[subprocess.CompletedProcess]:
    """FSDP2 on `count` simulated machines of 2 processes each (own working dirs, loopback, a local folder as the
    bucket); micro batch 1 x accumulation 2 on 4 ranks, 2 x 2 on 2: the same 8 blocks per step."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(count):
        cwd = tmp_path / f"machine{rank}"
        cwd.mkdir(parents=True, exist_ok=True)
        where = ["--num-machines", str(count), "--machine-rank", str(rank), "--main-process-ip", "127.0.0.1",
                 "--main-process-port", str(port)] if count > 1 else []
        cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", "2", *where,
               "--accelerate-config", FSDP_CONFIG, "--data", str(data), "--", *TINY, "--batch-size", str(2 // count),
               "--grad-accum", "2", "--run-name", "run", "--checkpoint-bucket", str(tmp_path / "bucket"), *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PICONEOX_CPU_FSDP": "1"}
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True))
    outs = [p.communicate(timeout=bound(150)) for p in procs]
    assert [p.returncode for p in procs] == [0] * count, "\n".join(err[-3000:] for _, err in outs)
    return [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip(procs, outs)]
