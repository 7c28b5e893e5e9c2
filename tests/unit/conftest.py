"""The unit tier runs in-process only: a test here that starts a process, a server or a process group fails.
It runs torch on one thread (tests.support.training.one_torch_thread), the session runs it sets up included."""
import contextlib

import pytest

from tests.support.processes import no_processes
from tests.support.tiers import tier_of
from tests.support.training import one_torch_thread


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # pytest calls this hook for every item of the run, whichever conftest defines it: guard only this tier's
    unit = tier_of(item.nodeid) == "unit"
    with no_processes(item.nodeid) if unit else contextlib.nullcontext():  # setup too: a module fixture is caught
        with one_torch_thread() if unit else contextlib.nullcontext():  # setup too: the session's trained runs
            yield
