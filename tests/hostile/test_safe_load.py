"""Loading a checkpoint never runs code from it: a payload in any pickled file of a checkpoint whose COMPLETE
marker was recomputed (anyone can) is refused by every entry point in one line, and never runs."""
import dataclasses
import io
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.payloads import Payload, torch_bytes
from tests.support.training import run
from utils.ckpt.format import DCP_INDEX, MARKER, check_complete, manifest, read_marker, write_marker
from utils.storage import open_storage

pytestmark = pytest.mark.usefixtures("one_thread", "fresh_accelerate_state")

STEP = "step-00000010"
# The .pt small states: what older checkpoints hold (scaler.pt: fp16 runs only); today's are JSON
PICKLED = (".metadata", "__0_0.distcp", "scheduler.pt", "scaler.pt", "rng-00000.pt")


def poison(folder: Path, name: str, flag: Path) -> None:
    """Hide a Payload in `folder/name`, the rest of the file still valid, and recompute the COMPLETE marker."""
    path = folder / name
    meta = pickle.loads((folder / DCP_INDEX).read_bytes())  # our own fixture's index: trusted
    if name == DCP_INDEX:
        meta.payload = Payload(flag)
        path.write_bytes(pickle.dumps(meta))
    elif name.endswith(".distcp"):  # a non-tensor value (an optimizer hyperparameter) now points at the payload
        index = next(i for i, info in meta.storage_data.items() if i.fqn.startswith("optim.param_groups.")
                     and info.relative_path == name)
        payload = torch_bytes(Payload(flag))
        meta.storage_data[index] = dataclasses.replace(meta.storage_data[index], offset=path.stat().st_size,
                                                       length=len(payload))
        with open(path, "ab") as f:
            f.write(payload)
        (folder / DCP_INDEX).write_bytes(pickle.dumps(meta))
    else:  # small states are JSON now: an older checkpoint's .pt is still read (bounded)
        (folder / f"{Path(name).stem}.json").unlink(missing_ok=True)
        state = torch.load(path, weights_only=False) if path.exists() else {"scale": 65536.0}
        path.write_bytes(torch_bytes({**state, "payload": Payload(flag)}))
    marker = read_marker(folder)
    names = {n for n in marker["files"] if (folder / n).exists()} | {name}
    write_marker(folder, marker["step"], marker["world_size"], manifest(folder, sorted(names)))
    assert check_complete(folder, verify=True) is None


def unrestricted_load(folder: Path, name: str) -> None:
    """How torch reads `name` when nothing restricts it (what piconeox 0c18f74 did)."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(folder)).read_metadata()  # pickle.load
    if name.endswith(".distcp"):  # DefaultLoadPlanner.load_bytes
        info = next(i for i in meta.storage_data.values() if i.relative_path == name and i.offset > 0 and
                    i.offset + i.length == (folder / name).stat().st_size)
        with open(folder / name, "rb") as f:
            f.seek(info.offset)
            torch.load(io.BytesIO(f.read(info.length)), weights_only=False)
    elif name.endswith(".pt"):
        torch.load(folder / name, weights_only=False)



@pytest.fixture
def work(tmp_path, trained):
    """A copy of the trained run to poison."""
    shutil.copytree(trained / "ckpt", tmp_path / "ckpt")
    shutil.copytree(trained / "logs", tmp_path / "logs")
    return tmp_path


def assert_refused(code: int, capsys, path: Path, flag: Path) -> None:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]  # the rest: the run's log lines
    assert not flag.exists(), "the payload ran"
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert f"{path}: refused to load: it asks for posix.system" in errors[0] and "never runs code" in errors[0], err


@pytest.mark.parametrize("name", PICKLED)
def test_the_payloads_run_when_loaded_unrestricted(work, name):
    """The payloads are real: what torch does without an allowlist runs them."""
    folder, flag = work / "ckpt" / "run" / STEP, work / "PWNED"
    poison(folder, name, flag)
    unrestricted_load(folder, name)
    assert flag.exists()


@pytest.mark.parametrize("how", ["folder", "auto"])
@pytest.mark.parametrize("name", PICKLED)
def test_resume_refuses_a_payload(work, tiny_data, capsys, name, how):
    folder, flag = work / "ckpt" / "run" / STEP, work / "PWNED"
    poison(folder, name, flag)
    capsys.readouterr()
    code, _, _ = run(work, tiny_data, "--max-steps", "12", "--resume", str(folder) if how == "folder" else "auto")
    assert_refused(code, capsys, folder / name, flag)


@pytest.mark.parametrize("name", PICKLED)
def test_resume_from_the_bucket_refuses_a_payload(work, tiny_data, gcs_emulator, capsys, name):
    """A colleague's run in a team bucket: downloaded (crc32c-checked against the recomputed marker), refused."""
    folder, flag = work / "ckpt" / "run" / STEP, work / "PWNED"
    poison(folder, name, flag)
    remote = open_storage(gcs_emulator.url("team/run")).child(STEP)
    for path in sorted(folder.iterdir(), key=lambda p: p.name == MARKER):  # the marker last
        remote.put(path, path.name)
    fresh = work / "fresh"
    capsys.readouterr()
    code, _, _ = run(fresh, tiny_data, "--max-steps", "12", "--resume", gcs_emulator.url("team/run"))
    cached = next((fresh / "ckpt" / ".remote-cache").rglob(STEP))
    assert_refused(code, capsys, cached / name, flag)


def test_tools_refuse_a_payload_in_the_index(work, tiny_data, capsys):
    """consolidate, generate, evaluate, to_gguf, rp2040.export and --init-from read a step folder's `.metadata`
    (and its tensors, which torch always loads with weights_only=True)."""
    from rp2040.export import main as export_main
    from utils.consolidate import main as consolidate_main
    from utils.evaluate import main as evaluate_main
    from utils.generate import main as generate_main
    from utils.to_gguf import main as gguf_main

    folder, flag = work / "ckpt" / "run" / STEP, work / "PWNED"
    poison(folder, DCP_INDEX, flag)
    text = work / "text.txt"
    text.write_text("Once upon a time there was a test.\n")
    calls = {"consolidate": lambda: consolidate_main([str(folder), "--out", str(work / "hf")]),
             "generate": lambda: generate_main([str(folder), "--max-new-tokens", "2"]),
             "evaluate": lambda: evaluate_main([str(folder), "--eval-perplexity", str(text)]),
             "export": lambda: export_main([str(folder), "--out", str(work / "pico")]),
             "to_gguf": lambda: gguf_main([str(folder), "--out", str(work / "model.gguf")]),
             "init-from": lambda: run(work / "init", tiny_data, "--max-steps", "1", "--init-from", str(folder))[0]}
    capsys.readouterr()
    for tool, call in calls.items():
        assert_refused(call(), capsys, folder / DCP_INDEX, flag)
    assert not (work / "hf").exists() and not (work / "pico").exists() and not (work / "model.gguf").exists()


def test_a_clean_checkpoint_loads_everywhere(work, tiny_data):
    """The allowlists hold everything our writer puts into a checkpoint: resume and the tools still work."""
    from utils.consolidate import main as consolidate_main

    code, losses, _ = run(work, tiny_data, "--max-steps", "12", "--resume", str(work / "ckpt" / "run" / STEP))
    log = (work / "logs" / "run" / "training.log").read_text()
    assert code == 0 and len(losses) == 12 and f"{STEP} at step 10" in log
    assert consolidate_main([str(work / "ckpt" / "run" / STEP), "--out", str(work / "hf")]) == 0


def test_a_resume_walks_the_index_once_and_never_trusts_other_bytes(work, tiny_data, monkeypatch):
    """check_pickle walks a pickle (1-3 s for a 1.2B model's index) once per process: a resume reads `.metadata`
    several times (which parts, which weights, the load); bytes that passed are let through by their digest, bytes
    that were refused are walked (and refused) every time."""
    from utils.ckpt.untrusted import bounded
    from utils.errors import PiconeoxError

    real, walked = bounded.pickle_cost, []
    monkeypatch.setattr(bounded, "pickle_cost", lambda data: walked.append(data) or real(data))
    monkeypatch.setattr(bounded, "_PASSED", type(bounded._PASSED)())
    index = (work / "ckpt" / "run" / STEP / DCP_INDEX).read_bytes()
    code, _, _ = run(work, tiny_data, "--max-steps", "12", "--resume", str(work / "ckpt" / "run" / STEP))
    assert code == 0 and walked.count(index) == 1
    deep = []
    for _ in range(bounded.MAX_PICKLE_DEPTH + 5):
        deep = [deep]
    deep = pickle.dumps(deep)
    for _ in range(2):
        with pytest.raises(PiconeoxError, match="nested"):
            bounded.check_pickle(deep, "x")
    assert walked.count(deep) == 2


def test_reading_the_index_reserves_what_it_reads_not_its_limit(trained):
    """`.metadata` was read with f.read(1 GiB + 1), which reserves 1 GiB up front for a ~10 KB file: under an
    address-space limit (the hostile suite's driver, strict overcommit) a resume failed with MemoryError."""
    import subprocess
    import sys

    code = f"""
import resource, sys
from utils.ckpt.untrusted.safe_load import SafeFileSystemReader
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), vm + (512 << 20)))  # half of what the old read reserved
print(len(SafeFileSystemReader({str(trained / "ckpt" / "run" / STEP)!r}).read_metadata().state_dict_metadata))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=bound(60),
                          cwd=REPO)
    assert proc.returncode == 0 and int(proc.stdout) > 0, proc.stderr[-2000:]
