"""Several ranks and launcher runs: two gloo ranks of a script, ./start_training.sh with N processes, bounded runs
and whole-tree kills."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

# train.py flags of the launcher tests (--config comes from the launcher)
TINY = ["--set", "model.num_layers=1", "--set", "model.hidden_size=32", "--set",
        "model.intermediate_size=64", "--seq-len", "32", "--log-every", "1", "--warmup-steps", "2",
        "--lr", "3e-3", "--max-steps", "12", "--save-every", "6", "--eval-every", "6"]


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

    fsdp=True: the production FSDP2 config, really sharded over gloo (PICONEOX_CPU_FSDP=1, utils/distributed.py).
    """
    config = ["--accelerate-config", str(REPO / "configs" / "accelerate" / "fsdp_production.yaml")] if fsdp else []
    cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", str(procs), *config,
           "--data", str(data), "--", *TINY, "--batch-size", str(micro_batch), "--run-name", "run",
           "--output-dir", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "logs"), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PICONEOX_CPU_FSDP": "1" if fsdp else "0"}
    proc = run_bounded(cmd, 300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    history = json.loads((tmp_path / "logs" / "run" / "history.json").read_text())
    return [r["train/loss"] for r in history if "train/loss" in r], proc


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
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        tree += frontier
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)
