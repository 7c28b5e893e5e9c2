"""The unit tier runs in-process only: a test here that starts a process, a server or a process group fails."""
import pytest

from tests.support.processes import no_processes


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with no_processes(item.nodeid):  # setup too: a module fixture that trains in a subprocess is caught as well
        yield
