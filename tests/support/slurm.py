"""A real two-node Slurm cluster on this host for tests: munged, slurmctld and two slurmd (n1, n2).

Everything lives in one temporary folder (its own slurm.conf, munge key and socket, spool and state folders,
free ports), so it never touches /etc/slurm or a system munged, and `stop()` ends every daemon it started.
Both nodes are this host (NodeHostname=localhost, NodeAddr=127.0.0.1): a job on n1 and n2 is two "machines"
that share a hostname and a filesystem, as cluster nodes share NFS.

    cluster = SlurmCluster.start(folder)      # or the `slurm` fixture in tests/slurm/conftest.py
    job = cluster.sbatch(["-N", "2", "configs/slurm/train.sbatch", ...])
    cluster.wait_state(job, {"COMPLETED"}, timeout=bound(150))
    cluster.stop()
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.bounds import bound

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}


def missing_reason() -> str | None:
    """Why a test cluster cannot start here (None when it can)."""
    if os.geteuid() != 0:
        return "real Slurm tests start slurmd as root: run them as root (CI does)"
    absent = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if absent:
        return (f"Slurm/munge not installed ({', '.join(absent)} missing): apt-get install -y slurmd slurmctld "
                "slurm-client munge (.ci/run does)")
    return None


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held together while chosen, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


CONF = """ClusterName=piconeox-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
# a job starts at the next scheduling pass (~1 s), not after the default 3 s batch_sched_delay
SchedulerParameters=batch_sched_delay=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
# scancel's SIGKILL comes KillWait after its SIGTERM: room for the clean stop (--grace-seconds)
KillWait=60
MinJobAge=600
SlurmdTimeout=60
InactiveLimit=0
Waittime=0
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n1_port} CPUs={cpus} State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n2_port} CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class SlurmCluster:
    """The daemons of one test cluster; `env` is what a client command needs (SLURM_CONF)."""

    def __init__(self, root: Path):
        self.root = root
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
        self._procs: list[subprocess.Popen] = []

    @classmethod
    def start(cls, root: Path, timeout: float | None = None) -> SlurmCluster:
        cluster = cls(Path(root))
        try:
            cluster._start(bound(30) if timeout is None else timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start(self, timeout: float) -> None:
        root = self.root
        for sub in ("munge", "state", "spool/n1", "spool/n2"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(root / "munge", 0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld, n1, n2 = free_ports(3)
        (root / "slurm.conf").write_text(CONF.format(root=root, ctld_port=ctld, n1_port=n1, n2_port=n2,
                                                     cpus=os.cpu_count() or 1))
        m = root / "munge"
        self._daemon([_binary("munged"), "--foreground", "--force", f"--socket={m}/munge.sock",
                      f"--key-file={key}", f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.log",
                      f"--seed-file={m}/munged.seed"], "munged")
        self._wait(lambda: (m / "munge.sock").exists(), timeout, "munged's socket")
        self._daemon([_binary("slurmctld"), "-D", "-f", str(root / "slurm.conf")], "slurmctld")
        self._wait(lambda: "UP" in self.out(["scontrol", "ping"]), timeout, "slurmctld")  # '' until it answers
        for node in ("n1", "n2"):
            self._daemon([_binary("slurmd"), "-D", "-N", node, "-f", str(root / "slurm.conf")], f"slurmd-{node}")
        self._wait(lambda: self.out(["sinfo", "-h", "-o", "%t", "-N"]).split() == ["idle", "idle"], timeout,
                   "both slurmd idle")

    def _daemon(self, cmd: list[str], name: str) -> None:
        log = open(self.root / f"{name}.out", "ab")
        proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self._procs.append(proc)

    def _wait(self, ready, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not ready():
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited {proc.returncode} while waiting for {what}: "
                                       f"{self.logs()}")
            if time.monotonic() > end:
                raise TimeoutError(f"{what} not ready within {timeout} s: {self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")))

    def out(self, cmd: list[str], **kwargs) -> str:
        """A client command's stdout ('' when it fails)."""
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=bound(15), **kwargs)
        return done.stdout if done.returncode == 0 else ""

    def sbatch(self, args: list[str], cwd: Path, env: dict | None = None) -> int:
        """Submit a job; its id."""
        done = subprocess.run(["sbatch", "--parsable", *args], env={**self.env, **(env or {})}, cwd=cwd,
                              capture_output=True, text=True, timeout=bound(15))
        if done.returncode != 0:
            raise RuntimeError(f"sbatch {args} failed: {done.stderr}")
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as {field: value} (empty once the controller forgot the job)."""
        text = self.out(["scontrol", "show", "job", "-o", str(job_id)])
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_state(self, job_id: int, states: set[str], timeout: float) -> str:
        """Wait until the job's state is one of `states` (or has ended otherwise); return the state. scontrol (a
        process each time) is asked when the controller's log grows, as it does when a job starts, ends or is
        cancelled, and every 2 s besides: a job's minute costs a few dozen client processes, not 120."""
        log = self.root / "slurmctld.log"
        end = time.monotonic() + timeout
        size, ask_at = -1, 0.0
        while True:
            grown = log.stat().st_size if log.exists() else 0
            if grown != size:
                size, ask_at = grown, 0.0
            if time.monotonic() >= ask_at:
                state = self.job(job_id).get("JobState", "")
                if state in states or state in ENDED:
                    return state
                ask_at = time.monotonic() + (0.5 if ask_at == 0.0 else 2.0)  # once more soon after a log line
            if time.monotonic() > end:
                raise TimeoutError(f"job {job_id} still {state or 'unknown'} after {timeout} s: {self.logs()}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Cancel every job, end every daemon this cluster started (SIGTERM, then SIGKILL), and wait for them."""
        if os.path.exists(self.root / "slurm.conf"):
            subprocess.run(["scancel", "--user", "root", "--full"], env=self.env, capture_output=True,
                           timeout=bound(15))
        for proc in reversed(self._procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=bound(10))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
