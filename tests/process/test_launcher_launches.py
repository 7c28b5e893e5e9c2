"""start_training.sh really launching through accelerate, with a stand-in train.py: the process count and one
process group, signals forwarded to the training processes, and the launcher waiting for their clean exit. The
accelerate line it builds and its bad input are in test_launcher.py."""
import os
import signal
import subprocess

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.signals import hangup_as_on_a_terminal
from tests.support.waits import running, wait_for

LAUNCHER = REPO / "start_training.sh"


# Real launches: a copy of the launcher next to a stand-in train.py, run by the real venv and accelerate.
STAND_IN = """
import os, signal, sys, time
if "--preflight" in sys.argv:  # the launcher's check before `accelerate launch`
    sys.exit(0)
out = sys.argv[sys.argv.index("--out") + 1]
rank = os.environ.get("RANK", "0")
def stop(signum, frame):  # like train.py: a save that takes a moment, then a clean exit 0
    time.sleep(1)
    open(os.path.join(out, f"signal-{rank}"), "w").write(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGHUP, stop)
if "--distributed" in sys.argv:
    from accelerate import Accelerator
    acc = Accelerator()
    import torch
    total = acc.reduce(torch.ones(1), reduction="sum").item()  # fails unless both ranks joined one group
    info = f"{acc.process_index} {acc.num_processes} {acc.device.type} {total:g} {os.environ['OMP_NUM_THREADS']}"
    open(os.path.join(out, f"rank-{acc.process_index}"), "w").write(info)
    acc.wait_for_everyone()  # then tear the gloo group down together: a rank leaving alone can abort
    acc.end_training()
else:
    open(os.path.join(out, f"pid-{rank}"), "w").write(str(os.getpid()))
    time.sleep(600)  # until the test's signal: a hang bound, never the expected end
"""


# A leftover `accelerate config` answer that breaks any multi-process launch that reads it.
STALE_DEFAULT_CONFIG = """
compute_environment: LOCAL_MACHINE
distributed_type: 'NO'
gpu_ids: '0'
mixed_precision: fp16
num_processes: 1
"""


@pytest.fixture
def sandbox(tmp_path):
    """A launcher copy whose train.py is the stand-in; .venv, configs/ and utils/ link to the repo's, and HF_HOME
    holds a stale accelerate default config the launcher must not be affected by."""
    (tmp_path / "start_training.sh").write_text(LAUNCHER.read_text())
    (tmp_path / "train.py").write_text(STAND_IN)
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "utils").symlink_to(REPO / "utils")  # utils/launch.py: accelerate launch with the run's exit code
    (tmp_path / "hf" / "accelerate").mkdir(parents=True)
    (tmp_path / "hf" / "accelerate" / "default_config.yaml").write_text(STALE_DEFAULT_CONFIG)
    (tmp_path / "out").mkdir()
    return tmp_path


def start(sandbox, *args, extra=()):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PICONEOX_FAKE_GPUS")}
    env.update(PICONEOX_FAKE_GPUS="0", HF_HOME=str(sandbox / "hf"))
    return subprocess.Popen(["bash", str(sandbox / "start_training.sh"), "--config", "test", *args, "--",
                             "--out", str(sandbox / "out"), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=hangup_as_on_a_terminal)


def test_procs_2_really_starts_two_ranks_in_one_process_group(sandbox):
    proc = start(sandbox, "--gpus", "0", "--procs", "2", extra=["--distributed"])
    _, err = proc.communicate(timeout=bound(60))
    assert proc.returncode == 0, err
    ranks = sorted((sandbox / "out").glob("rank-*"))
    assert [r.read_text() for r in ranks] == ["0 2 cpu 2 1", "1 2 cpu 2 1"]


@pytest.mark.parametrize("sig,procs", [(signal.SIGTERM, 1), (signal.SIGINT, 1), (signal.SIGHUP, 1), (signal.SIGTERM, 2),
                                       (signal.SIGHUP, 2)])
def test_signal_reaches_the_training_processes_and_the_launcher_waits_for_their_clean_exit(sandbox, sig, procs):
    proc = start(sandbox, "--gpus", "0", "--procs", str(procs))
    pid_files = [sandbox / "out" / f"pid-{rank}" for rank in range(procs)]
    def started() -> bool:
        assert proc.poll() is None, proc.stderr.read()  # the launcher ended before train.py started
        return all(f.exists() for f in pid_files)

    wait_for("train.py to start", started, timeout=bound(120))
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=bound(60))  # a generous bound: it asserts the clean exit, not its speed
    # the launcher returned only after each trainer's 1 s "save", with exit code 0 and no traceback
    assert [(sandbox / "out" / f"signal-{rank}").read_text() for rank in range(procs)] == [str(int(sig))] * procs
    assert proc.returncode == 0 and "Traceback" not in err, err
    # no orphan left behind (huggingface/accelerate#929): an orphan sleeps on for 600 s, far past this hang bound
    wait_for("every train.py to end", lambda: not any(running(int(f.read_text())) for f in pid_files),
             timeout=bound(60))
