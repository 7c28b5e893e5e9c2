"""Host memory at scale, measured on 2 real ranks over gloo (FSDP2 and DDP) with a ~100M-parameter model
(memory_probe.py)."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO

LAUNCH = {"fsdp2": ["--config_file", str(REPO / "configs" / "accelerate" / "fsdp_production.yaml")],
          "ddp": ["--multi_gpu"]}


def probe(tmp_path, data, kind: str, layers: int) -> list[dict]:
    """Each rank's report of memory_probe.py on 2 gloo ranks of `kind` (fsdp2 or ddp), by rank."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *LAUNCH[kind], "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
           str(REPO / "tests" / "support" / "memory_probe.py"), str(tmp_path), str(data), str(layers)]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "PICONEOX_CPU_FSDP": "1" if kind == "fsdp2" else "0",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=bound(150))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"rank"')),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in reports] == [0, 1]
    return reports


@pytest.fixture(scope="module")
def fsdp2_reports(tmp_path_factory, tiny_data):
    return probe(tmp_path_factory.mktemp("fsdp2"), tiny_data, "fsdp2", 14)  # ~100M parameters


@pytest.fixture(scope="module")
def ddp_reports(tmp_path_factory, tiny_data):
    return probe(tmp_path_factory.mktemp("ddp"), tiny_data, "ddp", 4)  # ~30M: dealing out whole tensors shows as well


@pytest.mark.parametrize("kind", ["fsdp2", "ddp"])
def test_a_save_stages_only_this_ranks_share_and_frees_it_once_written(kind, request):
    """At save time no rank copies more than ~1.2x checkpoint / world (DDP replicas included: 8 ranks staging the
    whole 17 GB state would pin 136 GB of host memory), and the saver thread lets the copy go once written."""
    reports = request.getfixturevalue(f"{kind}_reports")
    share = reports[0]["checkpoint_mb"] / len(reports)
    for r in reports:
        assert r["staged_mb"] <= 1.2 * share, r
        assert r["freed"], r


def test_sharded_save_and_load_hold_no_full_state(fsdp2_reports):
    rank0, rank1 = fsdp2_reports
    assert rank0["weights_mb"] > 350  # ~100M fp32 parameters
    # A save: rank 0 holds its own shard, not a gathered (and cloned) full state.
    assert rank0["save_mb"] < 1.5 * rank0["checkpoint_mb"]
    # No rank other than 0 ever holds the full optimizer state: not to save, not to resume.
    assert all(r["save_mb"] < r["optimizer_mb"] and r["load_mb"] < r["optimizer_mb"] for r in fsdp2_reports[1:])
    assert rank0["load_mb"] < rank0["optimizer_mb"]  # a resume reads shards in place, not torch.load of it all
    # Only rank 0 builds the fp32 weights; the others get their shards from it in prepare().
    assert rank1["build_mb"] < 0.1 * rank1["weights_mb"] < rank0["build_mb"]
