"""Shared test setup: no cloud traffic, offline hubs, and the path to ../shared/data."""
import os

# google-auth reads these at import time: never probe the cloud metadata address.
os.environ["NO_GCE_CHECK"] = "true"
os.environ["GCE_METADATA_HOST"] = "127.0.0.1:9"
os.environ["GCE_METADATA_IP"] = "127.0.0.1:9"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["tests.gcs_servers"]

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
# The skip reason says where each file comes from (README, "Tests without ../shared").
SHARED_DATA_MISSING = (
    f"real text not found at {SHARED_DATA}: put Tiny Shakespeare there as tinyshakespeare/input.txt "
    "(https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt), TinyStories "
    "as tinystories/tinystories_10k.txt and tinystories_val.txt (https://huggingface.co/datasets/roneneldan/TinyStories)"
    " and WikiText-2 as wikitext-2/valid.txt and test.txt (https://github.com/pytorch/examples, "
    "word_language_model/data/wikitext-2)")


@pytest.fixture
def shared_data() -> Path:
    """The real corpora in ../shared/data; skips when they are not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(SHARED_DATA_MISSING)
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """5% of the built-in demo corpus with the byte tokenizer (vocab 256): data for training tests."""
    from utils.data.prepare import prepare

    return prepare(["demo"], name="demo-byte-p5", out_dir=tmp_path_factory.mktemp("data"), tokenizer="byte",
                   dataset_percent=5)


def pytest_configure(config):
    # Single-process runs save and load DCP checkpoints without a process group on purpose.
    config.addinivalue_line("filterwarnings", "ignore:torch.distributed is disabled, unavailable or uninitialized")


@pytest.fixture(autouse=True, scope="session")
def wandb_offline(tmp_path_factory):
    """W&B never reaches the network in tests, and writes nothing outside a temp folder."""
    home = tmp_path_factory.mktemp("wandb")
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(home),
                      WANDB_CONFIG_DIR=str(home / "config"),
                      WANDB_CACHE_DIR=str(home / "cache"), WANDB_DATA_DIR=str(home / "data"))
    return home


# --- shared by several test modules: the tiny in-process training run, its fixtures, two gloo ranks -----------

TINY = ["--config", "test", "--set", "model.num_layers=1", "--set", "model.hidden_size=32", "--set",
        "model.num_heads=4", "--set", "model.intermediate_size=64", "--seq-len", "32", "--batch-size", "4",
        "--log-every", "1", "--warmup-steps", "2", "--lr", "3e-3"]


def run(tmp_path, data, *extra, name="run"):
    """Run train.py in-process (use the fresh_accelerate_state fixture); return (exit code, per-step train
    losses, run dir)."""
    import train

    code = train.main([*TINY, "--data", str(data), "--output-dir", str(tmp_path / "ckpt"), "--log-dir",
                       str(tmp_path / "logs"), "--run-name", name, *extra])
    history = tmp_path / "logs" / name / "history.json"
    losses = []
    if history.exists():
        losses = [r["train/loss"] for r in json.loads(history.read_text()) if "train/loss" in r]
    return code, losses, tmp_path / "ckpt" / name


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    """A 10-step run: its output folder (ckpt/run/step-00000010, best/, final/ and logs)."""
    from accelerate.state import AcceleratorState, GradientState

    out = tmp_path_factory.mktemp("trained")
    code, _, _ = run(out, tiny_data, "--max-steps", "10", "--save-every", "10", "--eval-every", "10",
                     "--sample-prompt", "")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    assert code == 0
    return out


@pytest.fixture
def fresh_accelerate_state():
    """Each in-process run builds its own Accelerator."""
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def one_thread(monkeypatch):
    """torch on one thread here and in subprocesses: same numerics everywhere, and no OpenMP spinning on a busy box."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(before)


def hangup_as_on_a_terminal() -> None:
    """preexec_fn for a launcher a test hangs up: SIGHUP at its default, as a login shell has it. A test runner
    started under nohup passes SIGHUP on ignored, and a signal ignored at start stays ignored (bash cannot trap
    it; train.py keeps it ignored on purpose), so the hang-up tests would wait for a stop that nohup forbids."""
    import signal

    signal.signal(signal.SIGHUP, signal.SIG_DFL)


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


def uf2_block(family: int) -> bytes:
    """One UF2 block (family id flag set) of zeros at the start of the RP2040's flash."""
    import struct

    from rp2040 import uf2

    head = struct.pack("<8I", uf2.MAGIC_START0, uf2.MAGIC_START1, uf2.FLAG_FAMILY_ID, 0x10000000, 256, 0, 1, family)
    return head + bytes(476) + struct.pack("<I", uf2.MAGIC_END)
