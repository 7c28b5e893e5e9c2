"""FSDP2 as production runs it, on CPU over gloo (PICONEOX_CPU_FSDP=1): micro-steps without gradient sync, the
same losses as DDP, checkpoints moving between the two (HSDP over several machines: test_hsdp.py)."""
import json
import os
import shutil
import sys

import pytest

from configs.model import MODEL_PRESETS
from tests.support.bounds import bound
from tests.support.hostile_checkpoints import remark
from tests.support.paths import REPO
from tests.support.ranks import FSDP_CONFIG, TINY, launch, relative_gap, run_bounded
from utils.ckpt.format import check_complete, read_marker, step_dir_name

# fp32, 2 ranks x micro batch 1 x accumulation 4 (the 8 blocks per step of test_distributed.py's runs), 30 steps
PARITY = ["--mixed-precision", "no", "--grad-accum", "4", "--max-steps", "30",
          "--save-every", "15", "--eval-every", "15"]


def test_fsdp2_stays_fsdp2_gathers_once_per_step_and_keeps_fp32_under_bf16():
    """After prepare() accelerate still runs FSDP2 (it fell back to MULTI_CPU when the prepared optimizer re-read
    its state): a step of 4 micro-steps all-gathers and reduce-scatters each FSDP unit once, as a step of one does
    (no sync in the first 3, parameters kept gathered across them). In FSDP2's own state under
    bf16: computes in bf16 (bf16 all-gathers) while master weights, gradients, their reduction and AdamW's states
    stay fp32 (accelerate alone would reduce in bf16: utils/run/accelerator.py's fsdp_plugin)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", FSDP_CONFIG, "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "bf16", "--dynamo_backend", "no", "--main_process_port", "0",
           str(REPO / "tests" / "support" / "fsdp_probe.py")]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "PICONEOX_CPU_FSDP": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO)}
    proc = run_bounded(cmd, bound(60), cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["fsdp2_after_prepare"] and report["describe"] == "FSDP2 fully_shard over 2 process(es)"
    four, one = report["steps"]
    # each unit (decoder layer, embedding, root) once per step, however many micro-steps
    assert four == one and one["_allgather_base_"] == one["_reduce_scatter_base_"] >= 3, report
    assert report["layer_units"] == MODEL_PRESETS["rp2040-speed"].num_layers  # each decoder layer an FSDP2 unit
    assert report["units"] >= 3 and report["policies"] == [["torch.bfloat16", "torch.float32"]], report
    assert report["collective_dtypes"]["_allgather_base_"] == ["torch.bfloat16"], report
    assert report["collective_dtypes"]["_reduce_scatter_base_"] == ["torch.float32"], report
    fp32 = ["torch.float32"]
    assert report["params"] == report["grads"] == report["optimizer_state"] == fp32, report


# the FSDP2 run compiles the whole model after prepare(), as a GPU run does (aot_eager: the same graphs as inductor's
# input, compiled in seconds on CPU instead of a minute)
COMPILED = ["--compile", "on", "--set", "train.compile_backend=aot_eager"]


@pytest.fixture(scope="module")
def parity(tmp_path_factory, tiny_data):
    """The same 30 steps as DDP and as FSDP2 compiled whole (checkpoints at 15 and 30)."""
    runs = {}
    for kind in ("ddp", "fsdp"):
        out = tmp_path_factory.mktemp(kind)
        losses, proc = launch(out, tiny_data, 2, 1, *PARITY, *(COMPILED if kind == "fsdp" else []),
                              fsdp=kind == "fsdp")
        runs[kind] = out, losses, proc
    return runs


def test_fsdp2_gives_ddps_losses_with_accumulation(parity):
    _, ddp, _ = parity["ddp"]
    out, fsdp, _ = parity["fsdp"]
    log = (out / "logs" / "run" / "training.log").read_text()
    assert "2 process(es) on cpu:0 (FSDP2 fully_shard over 2 process(es))" in log
    assert "micro batch 1 x 4 accumulation x 2 process(es)" in log
    assert len(ddp) == 30 and relative_gap(fsdp, ddp) < 1e-5
    assert ddp[-1] < ddp[0] - 1  # it learned: the comparison is not between two flat lines


def test_fsdp2_run_ends_cleanly_with_its_sample(parity):
    """Rank 0 alone sampling from the sharded model used to hang in the final barrier."""
    out, _, _ = parity["fsdp"]
    log = (out / "logs" / "run" / "training.log").read_text()
    assert "collective timeout 60 min" in log  # read back from the gloo group: the flag's default, not torch's 30
    # After step 1 a hang fails within --step-timeout-minutes (read back from each group), not within 60 minutes
    assert ("collective timeout 10 min from step 2 on (FSDP2 shard group 10 min, stop vote 10 min, checkpoint savers "
            "60 min)") in log
    assert "sample:\nOnce upon a time" in log
    assert check_complete(out / "ckpt" / "run" / "final") is None


def test_fsdp2_compiled_whole_after_prepare_stays_fsdp2_and_saves_plain_keys(parity):
    """torch.compile of the whole model after prepare() keeps FSDP2 (each decoder layer's
    fully_shard state read through the compiled wrapper, and the shard group the timeouts line reads from it), trains
    to DDP's losses (test_fsdp2_gives_ddps_losses_with_accumulation) and saves keys without `_orig_mod.`."""
    from safetensors import safe_open

    from utils.ckpt.parts import dcp_keys

    out, _, _ = parity["fsdp"]
    log = (out / "logs" / "run" / "training.log").read_text()
    assert ("compiled the whole model after prepare() (torch.compile, backend aot_eager); each of its 1 decoder "
            "layer(s) is still an FSDP2 unit") in log
    assert "(FSDP2 shard group 10 min," in log
    keys = dcp_keys(out / "ckpt" / "run" / step_dir_name(30))
    assert "model.gpt_neox.layers.0.attention.dense.weight" in keys
    assert not [k for k in keys if "_orig_mod" in k]
    with safe_open(str(out / "ckpt" / "run" / "final" / "model.safetensors"), "pt") as final:
        assert "gpt_neox.embed_in.weight" in final.keys() and not [k for k in final.keys() if "_orig_mod" in k]


def test_a_checkpoint_moves_from_ddp_to_fsdp2_and_back(parity, tiny_data, tmp_path):
    """DDP's step 15 resumes as FSDP2 shards over 4 ranks (accumulation 2), whose step 20 resumes under DDP on 2
    ranks: the uninterrupted losses all the way to step 30."""
    straight = parity["ddp"][1]
    (tmp_path / "four").mkdir()
    (tmp_path / "two").mkdir()
    step15 = parity["ddp"][0] / "ckpt" / "run" / step_dir_name(15)
    four, proc = launch(tmp_path / "four", tiny_data, 4, 1, *PARITY, "--grad-accum", "2", "--save-every", "5",
                        "--resume", str(step15), fsdp=True)
    assert "FSDP2 fully_shard over 4 process(es)" in proc.stderr
    step20 = tmp_path / "four" / "ckpt" / "run" / step_dir_name(20)
    assert read_marker(step20)["world_size"] == 4 and "__3_0.distcp" in read_marker(step20)["files"]
    two, proc = launch(tmp_path / "two", tiny_data, 2, 1, *PARITY, "--resume", str(step20))
    assert "(DDP)" in proc.stderr
    assert relative_gap(four[15:], straight[15:]) < 1e-5
    assert relative_gap(two[20:], straight[20:]) < 1e-5


def test_one_ranks_refused_file_is_every_ranks_one_line(parity, tiny_data, tmp_path):
    """An FSDP2 resume where one rank's own file is refused ends on every rank with that rank's one
    line; no rank waits in the sharded load for a rank that has gone (main: rank 0's gloo traceback came first).
    The FSDP2 run's step 15, copied, with rank 1's RNG file (only rank 1 reads it) made wrong and re-marked."""
    folder = tmp_path / "copy" / step_dir_name(15)
    shutil.copytree(parity["fsdp"][0] / "ckpt" / "run" / step_dir_name(15), folder)
    rng = json.loads((folder / "rng-00001.json").read_text())
    (folder / "rng-00001.json").write_text(json.dumps({**rng, "torch": "00ff"}))
    remark(folder)
    again = tmp_path / "again"
    again.mkdir()
    cmd = [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", "2", "--accelerate-config",
           FSDP_CONFIG, "--data", str(tiny_data), "--", *TINY, "--batch-size", "1", "--run-name", "run",
           "--output-dir", str(again / "ckpt"), "--log-dir", str(again / "logs"), *PARITY, *COMPILED, "--resume",
           str(folder)]
    resumed = run_bounded(cmd, bound(150), cwd=again,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PICONEOX_CPU_FSDP": "1"})
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("error: ")]
    assert resumed.returncode == 2 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert errors and all("rank 1: " in e and "rng-00001.json: not an RNG state" in e for e in errors), errors
