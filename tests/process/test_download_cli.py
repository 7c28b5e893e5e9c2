"""download_training_data.py as users run it: exit codes, one-line errors, summaries, both directions."""
import subprocess
import sys

import pytest

import download_training_data as cli
from tests.support.bounds import bound
from tests.support.paths import REPO


def run_script(*args: str) -> subprocess.CompletedProcess:
    """The script in a fresh interpreter (inherits this test's STORAGE_EMULATOR_HOST)."""
    return subprocess.run([sys.executable, str(REPO / "download_training_data.py"), *args, "--quiet"],
                          capture_output=True, text=True, timeout=bound(120), cwd=REPO)


def test_download_then_rerun_in_a_real_process(gcs_emulator, text_tree, tmp_path):
    for name, data in text_tree.items():
        gcs_emulator.put(f"data/text/{name}", data)
    dest = tmp_path / "data" / "text"
    first = run_script("--source", gcs_emulator.url("data/text"), "--dest", str(dest))
    assert first.returncode == 0, first.stderr
    assert f"downloaded {len(text_tree)} files" in first.stdout and "failed 0" in first.stdout
    again = run_script("--source", gcs_emulator.url("data/text"), "--dest", str(dest))
    assert again.returncode == 0 and "downloaded 0 files (0.0 MB" in again.stdout
    assert f"skipped {len(text_tree)}" in again.stdout


def test_bad_key_is_one_line_without_traceback(gcs_emulator, tmp_path):
    key = tmp_path / "key.json"
    key.write_text('{"private_key": "TOP-SECRET"')
    result = run_script("--source", gcs_emulator.url("d"), "--dest", str(tmp_path / "d"), "--credentials", str(key))
    assert result.returncode == 2
    assert result.stderr.startswith("error: credentials file") and str(key) in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and "TOP-SECRET" not in result.stderr
    assert not (tmp_path / "d").exists()


def test_failed_files_give_exit_1_and_are_listed(gcs_emulator, tmp_path, capsys):
    gcs_emulator.put("d/ok.txt", b"fine")
    gcs_emulator.put("d//etc/evil", b"evil")
    assert cli.main(["--source", gcs_emulator.url("d"), "--dest", str(tmp_path / "d"), "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert "failed: refusing object name '/etc/evil'" in err and "downloaded 1 files" in out and "failed 1" in out


def test_push_and_download_with_a_local_bucket(text_tree, tmp_path, capsys):
    src = tmp_path / "data" / "ds"
    for name, data in {**text_tree, "manifest.json": b"{}"}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    bucket = f"file://{tmp_path}/bucket/data/ds"
    assert cli.main(["--push", str(src), "--dest", bucket, "--dry-run", "--quiet"]) == 0
    assert "dry run: would have uploaded" in capsys.readouterr().out and not (tmp_path / "bucket").exists()
    assert cli.main(["--push", str(src), "--dest", bucket, "--quiet"]) == 0
    capsys.readouterr()
    # a faithful copy, then the dataset check: this manifest.json ("{}") describes no dataset
    assert cli.main(["--source", bucket, "--dest", str(tmp_path / "copy"), "--quiet"]) == 2
    assert all((tmp_path / "copy" / n).read_bytes() == d for n, d in text_tree.items())
    assert "the downloaded dataset does not match its manifest" in capsys.readouterr().err


def test_bad_flags_are_refused(tmp_path, capsys):
    for argv, message in [
        (["--source", str(tmp_path), "--dest", "d", "--workers", "0"], "--workers must be at least 1, got 0"),
        (["--source", "s4://bucket/x", "--dest", "d"], "unsupported storage location 's4://bucket/x'"),
        (["--source", str(tmp_path), "--dest", "d", "--no-overwrite"], "--no-overwrite applies only to --push"),
        (["--push", str(tmp_path / "none"), "--dest", str(tmp_path / "b")], "nothing to upload"),
    ]:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err


def test_help_documents_both_directions(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--source URL" in out and "--push DIR" in out and "--dest DIR|URL" in out and "--include GLOB" in out
