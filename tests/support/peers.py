"""A process that waits for peers which never come: started in a session of its own (a terminal's process group), its
stderr read on a thread, so a test waits for the line saying what it waits for, then signals it."""
from __future__ import annotations

import os
import subprocess
import threading
import time

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.waits import wait_for


class Waiter:
    """`command` running in its own session; `err` grows as it writes to stderr."""

    def __init__(self, command: list[str], cwd, env: dict | None = None):
        self.proc = subprocess.Popen(command, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.err = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.err += line

    def wait_for_line(self, text: str) -> None:
        wait_for(f"{text!r} on stderr", lambda: text in self.err or self.proc.poll() is not None)
        assert text in self.err, f"exit {self.proc.returncode} before {text!r}:\n{self.err}"

    def finish(self, timeout: float = 60) -> tuple[int, float]:
        """(exit code, seconds it took from now); `timeout`: the hang bound on a quiet box."""
        start = time.monotonic()
        self.proc.stdout.read()
        code = self.proc.wait(bound(timeout))
        self._reader.join(bound(10))
        return code, time.monotonic() - start

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def second_machine(tmp_path, port: int, *extra: str) -> Waiter:
    """start_training.sh as machine 1 of 2, whose machine 0 never starts."""
    return Waiter([str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--data", "demo",
                   "--num-machines", "2", "--machine-rank", "1", "--main-process-ip", "127.0.0.1",
                   "--main-process-port", str(port), *extra], cwd=tmp_path)
