"""Fixtures shared by the uploader's tests against GCS servers (tests/gcs/test_uploader*.py)."""
import logging

import pytest

from tests.support.uploads import Trainer


@pytest.fixture
def logs_reach_caplog(monkeypatch, caplog):
    """train.py's setup_logging stops "piconeox" records at its own handlers; let caplog see them here."""
    monkeypatch.setattr(logging.getLogger("piconeox"), "propagate", True)
    caplog.set_level(logging.INFO, logger="piconeox")


@pytest.fixture
def trainer(tiny_data, tmp_path) -> Trainer:
    return Trainer(tiny_data, tmp_path / "logs")
