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
    with one_torch_thread() if tier_of(item.nodeid) == "unit" else contextlib.nullcontext():  # the session's runs
        yield


def _guarded(item):
    # setup (a module fixture is caught) and call; not teardown, where the last test of a worker also tears down
    # the session's fixtures of other tiers (a Slurm cluster)
    return no_processes(item.nodeid) if tier_of(item.nodeid) == "unit" else contextlib.nullcontext()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _guarded(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _guarded(item):
        yield
