"""setup.sh: idempotent runs, clear failures."""
import os
import stat
import subprocess

from tests.support.bounds import bound
from tests.support.paths import REPO


def setup(*args, env=None):
    return subprocess.run(["bash", str(REPO / "setup.sh"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=bound(300), env={**os.environ, **(env or {})})


def test_rerun_with_dev_tools_reports_torch_and_cuda():
    assert setup("--dev").returncode == 0
    proc = setup("--dev")  # nothing changed: no pip install, no npm install
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "MicroPython interpreter up to date" in proc.stdout
    assert "python packages up to date" in proc.stdout
    assert "torch 2.13.0" in proc.stdout and "CUDA visible: no (CPU only)" in proc.stdout


def test_plain_run_completes():
    """The README's first command runs setup.sh without --dev: it must reach the end, not stop silently."""
    proc = setup()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "==> ready: .venv/bin/python" in proc.stdout


def test_unknown_option_and_old_python_fail_with_one_line(tmp_path):
    proc = setup("--gpu")
    assert proc.returncode == 2 and proc.stderr.strip() == "setup.sh: error: unknown option '--gpu' (allowed: --dev)"
    fake = tmp_path / "python3.8"
    fake.write_text("#!/bin/sh\ncase \"$2\" in *version_info*) exit 1;; *) echo 3.8.18;; esac\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    proc = setup(env={"PYTHON": str(fake)})
    assert proc.returncode == 1
    assert proc.stderr.strip() == "setup.sh: error: Python 3.8.18 is too old; 3.10 or newer is required"
