"""The unit tier runs in-process only: a test here that starts a process, a server or a process group fails.
It runs torch on one thread: the same numerics in every test, and no OpenMP threads spinning for a core that a
busy box does not give them (a 6-step in-process run took 30 s on two threads beside other work, 1.7 s on one)."""
import contextlib

import pytest

from tests.support.processes import no_processes
from tests.support.tiers import tier_of


@contextlib.contextmanager
def one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # pytest calls this hook for every item of the run, whichever conftest defines it: guard only this tier's
    unit = tier_of(item.nodeid) == "unit"
    with no_processes(item.nodeid) if unit else contextlib.nullcontext():  # setup too: a module fixture is caught
        with one_torch_thread() if unit else contextlib.nullcontext():  # setup too: the session's trained runs
            yield
