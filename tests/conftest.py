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
