"""rp2040.serve without a terminal: under nohup, a script or a service its stdin is /dev/null;
it announced its port and shut the board down a second later. It serves until a signal now."""
import os
import signal
import socket
import subprocess
import sys

import pytest

from rp2040 import emulate
from tests.support.bounds import bound
from tests.support.paths import REPO

pytestmark = pytest.mark.skipif(emulate.unavailable() is not None, reason=str(emulate.unavailable()))


def test_serve_with_stdin_closed_keeps_the_board_until_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "rp2040.serve", "--port", "0"], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        announced = proc.stdout.readline()
        assert announced.startswith("emulated Pico on socket://127.0.0.1:"), announced + proc.stderr.read()
        port = int(announced.split()[3].rstrip(":").rsplit(":", 1)[1])
        proc.stdout.readline()  # "type reset + Enter ..."
        closed = proc.stdout.readline()  # EOF here (the server gone) before the fix
        assert closed.startswith("stdin closed: serving until Ctrl-C or SIGTERM"), closed + proc.stderr.read()
        with socket.create_connection(("127.0.0.1", port), timeout=bound(15)):  # the board still answers
            assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=bound(30)) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
