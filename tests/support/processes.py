"""What the suite starts: a count of the processes each run launches (printed at the end), and the unit tier's
rule that its tests start none (no subprocess, no fork, no listening socket, no process group)."""
import contextlib
import multiprocessing.util
import os
import socket
import subprocess

import pytest

STARTED = {"processes": 0}
_execute_child = subprocess.Popen._execute_child


def _counting(self, *args, **kwargs):
    STARTED["processes"] += 1
    return _execute_child(self, *args, **kwargs)


subprocess.Popen._execute_child = _counting  # every subprocess.run/Popen/check_output goes through here


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its count goes to the controller
        session.config.workeroutput["processes_started"] = STARTED["processes"]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    # the controller adds up its workers' counts; its own count holds the workers themselves (one Popen each)
    STARTED["processes"] += node.workeroutput.get("processes_started", 0) - 1


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"processes started by the tests: {STARTED['processes']} (subprocess, this run)")


@contextlib.contextmanager
def no_processes(where: str):
    """Refuse, for the duration, everything that starts a process, a server or a process group."""
    def refuse(*_args, **_kwargs):
        raise AssertionError(f"{where} is a unit test: it may not start a process, a server or a process group "
                             "(move it to the tier of what it starts: tests/process, tests/ranks, tests/gcs, ...)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "_execute_child", refuse)
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            mp.setattr(os, name, refuse)
        mp.setattr(multiprocessing.util, "spawnv_passfds", refuse)
        mp.setattr(socket.socket, "listen", refuse)
        with contextlib.suppress(ImportError):
            import torch.distributed as dist

            mp.setattr(dist, "init_process_group", refuse)
        yield
