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
# torch on one thread in this process and every process it starts (a test of the launcher's own choice removes it):
# with two workers and their ranks on two cores, OpenMP's extra threads only spin while they wait for a core.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import signal  # noqa: E402

# A shell starts background jobs (`nohup ... &`, CI wrappers) with SIGINT ignored, and an ignored signal stays ignored
# across exec: every run a test Ctrl-Cs would then train on. The test runner takes Ctrl-C as a terminal gives it.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from pathlib import Path

import pytest

from tests.support.bounds import load_factor
from tests.support.paths import SHARED_DATA, SHARED_DATA_MISSING
from tests.support.training import LONG_RUN, one_torch_thread, reset_accelerate_state, run

pytest_plugins = ["tests.support.gcs_servers", "tests.support.s3_servers", "tests.support.processes",
                  "tests.support.tiers"]


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


@pytest.fixture(scope="session")
def char_data(tmp_path_factory) -> Path:
    """The same 5% of the demo corpus with the char tokenizer: a dataset of another tokenizer, prepared once."""
    from utils.data.prepare import prepare

    return prepare(["demo"], name="demo-char-p5", out_dir=tmp_path_factory.mktemp("data"), tokenizer="char",
                   workers=1, dataset_percent=5)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core, at most 4: each worker's tests start several ranks of their own."""
    return max(1, min(os.cpu_count() or 1, 4))


def pytest_configure(config):
    try:  # a bad PICONEOX_TEST_LOAD_FACTOR stops the run before any test, naming the value
        load_factor()
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
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


@pytest.fixture(scope="session")
def trained(tmp_path_factory, tiny_data):
    """A 10-step run, trained once per test run: its output folder (ckpt/run/step-00000010, best/, final/ and logs).
    Shared: a test that changes it works on a copy (shutil.copytree)."""
    out = tmp_path_factory.mktemp("trained")
    code, _, _ = run(out, tiny_data, "--max-steps", "10", "--save-every", "10", "--eval-every", "10",
                     "--sample-prompt", "")
    reset_accelerate_state()
    assert code == 0
    return out


@pytest.fixture(scope="session")
def trained_long(tmp_path_factory, tiny_data):
    """A 40-step run on one thread (LONG_RUN; run() trains on one, as the tests resuming it do: their losses must
    match exactly), trained once per test run: its output folder (ckpt/run/step-00000010 to step-00000040, best/,
    final/ and logs; val loss ~3.3, far below ln(256) = 5.5). Shared: copy it to change it."""
    out = tmp_path_factory.mktemp("trained-long")
    try:
        code, _, _ = run(out, tiny_data, *LONG_RUN)
    finally:
        reset_accelerate_state()
    assert code == 0
    return out


@pytest.fixture
def fresh_accelerate_state():
    """Each in-process run builds its own Accelerator."""
    yield
    reset_accelerate_state()


@pytest.fixture
def one_thread(monkeypatch):
    """torch on one thread here and in subprocesses: same numerics everywhere, and no OpenMP spinning on a busy box."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with one_torch_thread():
        yield


