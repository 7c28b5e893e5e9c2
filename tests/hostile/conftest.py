"""Fixtures shared by the hostile tests."""
import shutil

import pytest


@pytest.fixture
def work(tmp_path, trained):
    """A copy of the trained run's checkpoints to poison (test_safe_load.py's own `work` copies its logs too)."""
    shutil.copytree(trained / "ckpt", tmp_path / "ckpt")
    return tmp_path
