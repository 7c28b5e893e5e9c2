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

from pathlib import Path

import pytest

from tests.support.paths import SHARED_DATA, SHARED_DATA_MISSING
from tests.support.training import run

pytest_plugins = ["tests.support.gcs_servers", "tests.support.processes", "tests.support.tiers"]


@pytest.fixture
def shared_data() -> Path:
    """The real corpora in ../shared/data; skips when they are not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(SHARED_DATA_MISSING)
    return SHARED_DATA


@pytest.fixture
def shakespeare(shared_data) -> str:
    """Tiny Shakespeare's text (skips without ../shared/data)."""
    return (shared_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    """5% of the built-in demo corpus with the byte tokenizer (vocab 256): data for training tests."""
    from utils.data.prepare import prepare

    return prepare(["demo"], name="demo-byte-p5", out_dir=tmp_path_factory.mktemp("data"), tokenizer="byte", workers=1,
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


