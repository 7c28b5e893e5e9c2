"""A loader of untrusted bytes ends on the first SIGTERM or Ctrl-C whatever it is doing, even
under a training run's handlers (which only ask for a clean stop at the next micro-step). The loader runs in a
child process under a memory limit of its input's size plus a fixed margin; the signal is sent once the child
has read the hostile file (its read bytes, /proc/PID/io), and the test waits for its exit with a hang bound."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.bounds import bound
from tests.support.hostile_pickles import long_walk, torch_zip

REPO = Path(__file__).resolve().parents[2]
MARGIN = 512 << 20
HANG = bound(60)  # seconds: the walk and unpickling of this input alone take 20+ s; only a hang reaches the bound
CHILD = """
import resource, signal, sys
from pathlib import Path
from utils.errors import PiconeoxError
size, path, loader, handler = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
from utils.ckpt.untrusted.safe_load import SafeFileSystemReader, load_small_state
from utils.run.preemption import StopRequest
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + size + (512 << 20),) * 2)  # the load's memory: its input + a margin
stop = StopRequest().install() if handler == "run" else None
print("ready", next(l.split()[1] for l in open("/proc/self/io") if l.startswith("rchar")), flush=True)
try:
    SafeFileSystemReader(str(path.parent)).read_metadata() if loader == "index" else load_small_state(path)
except PiconeoxError as e:
    print(f"error: {e}", file=sys.stderr)
    print(f"stop requested: {stop.requested if stop else None}", flush=True)
    sys.exit(2)
"""


def read_bytes(pid: int) -> int:
    return int(next(line for line in open(f"/proc/{pid}/io") if line.startswith("rchar")).split()[1])


@pytest.mark.parametrize("loader,sig,handler", [("index", signal.SIGTERM, "run"),
                                                ("small state", signal.SIGTERM, "run"),
                                                ("index", signal.SIGINT, "run"),
                                                ("small state", signal.SIGINT, "default")])
def test_a_long_load_stops_on_the_first_signal(tmp_path, loader, sig, handler):
    data = long_walk(4_999_990)  # 10 MB: every opcode walked (~10 s), then unpickled (~10 s more)
    path = tmp_path / (".metadata" if loader == "index" else "scheduler.pt")
    path.write_bytes(data if loader == "index" else torch_zip(data))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path.stat().st_size), str(path), loader, handler],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        ready = child.stdout.readline().split()
        assert ready[:1] == ["ready"], child.communicate()[1][-2000:]
        start, end = int(ready[1]), time.monotonic() + HANG
        while read_bytes(child.pid) < start + path.stat().st_size and time.monotonic() < end:
            time.sleep(0.01)  # the event: the child has read the file; its walk is under way
        child.send_signal(sig)
        out, err = child.communicate(timeout=HANG)
    finally:
        child.kill()
    name = signal.Signals(sig).name
    assert child.returncode == 2 and f"stopped by {name} while reading" in err and "Traceback" not in err, err[-2000:]
    assert f"stop requested: {True if handler == 'run' else None}" in out  # the run's handler saw it too
