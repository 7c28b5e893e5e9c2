"""Where a checkpoint's tools may write, checked in-process: consolidate never writes into the run's own
checkpoints, a local bucket that is a file is refused before any step, a push from inside the run folder names its
objects. Each refusal is one PiconeoxError line naming the value and leaves everything as it was."""
import hashlib
from pathlib import Path

import pytest

from utils.errors import PiconeoxError


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*")
            if p.is_file()}


def test_consolidate_never_writes_into_the_runs_own_checkpoints(trained, tmp_path):
    """Unchecked, --out <run>/final replaced final/ (exit 0), then --resume <run>/final failed; --out inside a
    step folder wrote a model rotation deletes; a best/ input blamed --out."""
    from utils.ckpt.format import find_checkpoint
    from utils.ckpt.write import consolidate

    run_dir = trained / "ckpt" / "run"
    step = run_dir / "step-00000010"
    before = snapshot(run_dir)
    for out, words in [(run_dir / "final", "is one of the run's own checkpoints"),
                       (run_dir / "best", "is one of the run's own checkpoints"),
                       (run_dir / "step-00000020", "is one of the run's own checkpoints"),
                       (step / "model", f"is inside the checkpoint {step}"),
                       (run_dir / "final" / "hf", "is inside the checkpoint"),
                       (run_dir / ".step-00000020.tmp", "is one of the run's own checkpoints"),
                       (step / ".." / "final", f"{run_dir / 'final'} is one of the run's own checkpoints")]:
        with pytest.raises(PiconeoxError, match="--out .*" + words):
            consolidate(step, out)
    with pytest.raises(PiconeoxError, match=f"{run_dir / 'best'} is consolidated already"):
        consolidate(run_dir / "best", tmp_path / "from-best")
    assert snapshot(run_dir) == before and not (tmp_path / "from-best").exists()
    assert find_checkpoint(run_dir / "final", resume=True) == run_dir / "final"  # still resumable
    models = tmp_path / "models" / "m"
    assert consolidate(step, models) == models and consolidate(step, models) == models  # its own output: replaced
    with pytest.raises(PiconeoxError, match="is inside the checkpoint"):
        consolidate(step, models / "nested")


def test_a_local_bucket_that_is_a_file_is_refused_before_any_step(tmp_path, tiny_data, capsys, fresh_accelerate_state):
    """Unchecked, the run trained, then exited 3 ("try later") for a bucket path that can never work."""
    from tests.support.training import run
    from utils.storage import open_storage

    a_file = tmp_path / "bucket"
    a_file.write_text("x")
    for url, words in ((a_file, "is a file"), (a_file / "sub", f"lies under the file {a_file}")):
        with pytest.raises(PiconeoxError, match=f"bucket {url} {words}"):
            open_storage(str(url))
    code, losses, run_dir = run(tmp_path, tiny_data, "--max-steps", "2", "--checkpoint-bucket", str(a_file))
    assert code == 2 and losses == [] and not list(run_dir.glob("step-*")), capsys.readouterr().err
    assert f"error: bucket {a_file} is a file" in capsys.readouterr().err


def test_push_from_inside_the_run_folder(trained, tmp_path, monkeypatch):
    """Unchecked, `push_checkpoint.py .` uploaded under an empty object name and exited 3."""
    from utils.push_checkpoint import push

    monkeypatch.chdir(trained / "ckpt" / "run")
    assert push(Path("."), str(tmp_path / "bucket"), None).endswith(f"{tmp_path / 'bucket'}/run/step-00000010")
    assert (tmp_path / "bucket" / "run" / "step-00000010" / "COMPLETE").is_file()
