"""A run dies with its launcher, one run per name: real start_training.sh launches of train.py (gloo on CPU).

SIGHUP (a closed terminal) stops like SIGTERM; a launcher killed with SIGKILL takes its training processes with
it after their save; a clean stop never waits for ever on a peer; a run name is locked by every process
that writes it, so a second start is refused in one line before the launch.
"""
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path


from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.ranks import STUCK_PEER, start_two_ranks
from tests.support.signals import hangup_as_on_a_terminal
from tests.support.waits import command_line, process_state, wait_for
from utils.ckpt.format import check_complete, step_dir_name
from utils.run import runlock

TINY = ["--set", "model.num_layers=1", "--set", "model.hidden_size=32", "--set", "model.num_heads=4", "--set",
        "model.intermediate_size=64", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "2", "--lr", "3e-3"]
HOST = socket.gethostname()


def launcher_cmd(tmp_path: Path, data: Path, procs: int, *extra: str) -> list[str]:
    return [str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--procs", str(procs), "--data",
            str(data), "--", *TINY, "--output-dir", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "logs"),
            "--run-name", "r", "--eval-every", "1000", "--save-every", "5", *extra]


def launcher_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PICONEOX_", "OMP_NUM_THREADS"))}
    return {**env, "PICONEOX_FAKE_GPUS": "0"}


def alive(pid: int) -> bool:
    return runlock.start_time(pid) is not None


def lock_holders(tmp_path: Path) -> list[dict]:
    path = tmp_path / "ckpt" / ".locks" / "r.lock"
    try:
        return [json.loads(line) for line in path.read_text().splitlines()]
    except FileNotFoundError:
        return []


def training(tmp_path: Path, procs: int) -> list[int]:
    """Pids of the launcher and every rank, once all ranks hold the lock and a checkpoint is saved. Any step's: the
    run saves every 5 steps and keeps 3, so step 5 lives about a second, less than a poll may take on a busy box."""
    holders = lock_holders(tmp_path)
    if len(holders) == procs + 1 and any(saved(folder) for folder in (tmp_path / "ckpt" / "r").glob("step-*")):
        return [h["pid"] for h in holders]
    return []


def saved(folder: Path) -> bool:
    try:
        return check_complete(folder) is None
    except OSError:  # rotated away while it was read
        return False


def test_two_launchers_at_once_one_wins_the_other_exits_2_before_the_launch(tmp_path, tiny_data):
    cmds = [launcher_cmd(tmp_path, tiny_data, 1, "--max-steps", "3") for _ in range(2)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=launcher_env())
             for c in cmds]
    results = sorted(((*p.communicate(timeout=bound(150)), p.returncode) for p in procs), key=lambda r: r[2])
    results = [(code, out, err) for out, err, code in results]
    (won, won_out, won_err), (lost, lost_out, lost_err) = results
    assert won == 0, won_err
    assert lost == 2 and lost_err.count("\n") == 1 and "Traceback" not in lost_err, lost_err
    assert lost_err.startswith("error: run r is still being written by pid ")
    assert f"(start_training.sh) on {HOST}" in lost_err
    assert "under accelerate launch" not in lost_out  # refused in the preflight: nothing was launched
    assert "accelerate.commands.launch" not in won_out  # a line unsafe to Ctrl-C by hand is not offered
    assert not (tmp_path / "ckpt" / ".locks").exists()  # the winner gave the lock back on exit


# --- the launcher dies: nothing outlives it, the restart waits for the save -------------------------------

def test_launcher_killed_the_run_saves_and_stops_and_a_restart_meanwhile_is_refused(tmp_path, tiny_data):
    grace = 60  # the bound asserted below: generous, since it asserts a stop within the grace, not its speed
    cmd = launcher_cmd(tmp_path, tiny_data, 2, "--max-steps", "100000", "--grace-seconds", str(grace))
    err = open(tmp_path / "first.err", "w+")  # a file: an unread pipe would fill up and block the run's output
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True, env=launcher_env())
    pids = wait_for("two ranks training", lambda: training(tmp_path, 2))
    assert pids[0] == first.pid
    again = subprocess.run([*cmd, "--resume", "auto"], capture_output=True, text=True, env=launcher_env(),
                           timeout=bound(150))
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    listed = ", ".join(f"{p} ({role})" for p, role in zip(pids, ["start_training.sh", "rank 0", "rank 1"]))
    assert again.stderr.startswith(f"error: run r is still being written by pids {listed} on {HOST}")

    first.kill()  # SIGKILL: no trap runs, nothing is forwarded by the launcher
    try:  # a hang bound: past the grace a rank ends itself without saving, which the log below would show
        wait_for("the ranks to stop", lambda: not any(alive(p) for p in pids[1:]), timeout=bound(grace * 2.5))
    finally:
        log = (tmp_path / "logs" / "r" / "training.log").read_text()
    assert "did not finish within --grace-seconds" not in log, (  # within the grace: the save, not the deadline
        log[-2000:], (tmp_path / "first.err").read_text()[-2000:])
    step = int(log.split("SIGTERM received: saving step ")[1].split()[0])
    assert check_complete(tmp_path / "ckpt" / "r" / step_dir_name(step)) is None
    assert "SIGTERM received; stopped cleanly" in log
    assert lock_holders(tmp_path) == []  # the last rank to leave removed the lock

    resumed = subprocess.run([*cmd[:-4], "--max-steps", str(step + 2), "--resume", "auto"], capture_output=True,
                             text=True, env=launcher_env(), timeout=bound(150))
    assert resumed.returncode == 0, resumed.stderr
    assert f"at step {step} " in (tmp_path / "logs" / "r" / "training.log").read_text().split("resumed from")[1]


def test_closing_the_terminal_stops_the_run_cleanly(tmp_path, tiny_data):
    """The launcher's controlling terminal hangs up (an ssh drop): SIGHUP, a save, exit 0, no process left."""
    master, slave = os.openpty()

    def controlling_terminal():
        hangup_as_on_a_terminal()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(launcher_cmd(tmp_path, tiny_data, 1, "--max-steps", "100000"), stdin=slave,
                            stdout=slave, stderr=slave, env=launcher_env(), start_new_session=True,
                            preexec_fn=controlling_terminal)
    os.close(slave)
    output: list[bytes] = []
    threading.Thread(target=drain, args=(master, output), daemon=True).start()  # a full terminal would block the run
    def started() -> list[int]:
        assert proc.poll() is None, "the launcher ended before training"
        return training(tmp_path, 1)

    try:
        pids = wait_for("the run training", started, timeout=bound(150))
    except AssertionError:  # say what the run was doing: its exit code, each process's state, what it printed
        raise AssertionError(f"exit {proc.poll()}; processes {process_states(proc.pid)}; terminal: "
                             f"{b''.join(output)[-3000:].decode(errors='replace')}") from None
    os.close(master)  # the terminal goes away: the kernel hangs it up
    assert proc.wait(timeout=bound(90)) == 0  # a clean stop, not a timing goal: a loaded 2-core box took over 60 s
    log = (tmp_path / "logs" / "r" / "training.log").read_text()
    assert "SIGHUP received; stopped cleanly" in log
    step = int(log.split("SIGHUP received: saving step ")[1].split()[0])
    assert check_complete(tmp_path / "ckpt" / "r" / step_dir_name(step)) is None
    assert not any(alive(p) for p in pids) and lock_holders(tmp_path) == []


def drain(fd: int, into: list[bytes]) -> None:
    try:
        while chunk := os.read(fd, 4096):
            into.append(chunk)
    except OSError:
        pass


def process_states(root: int) -> list[str]:
    """'pid name state' of `root` and its descendants (state T: stopped, e.g. by SIGTTOU/SIGTTIN on a terminal)."""
    stats = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat_file.read_text().split(" (", 1)
            name, fields = rest.rsplit(") ", 1)
            stats[int(pid)] = (name, *fields.split()[:2])  # state, parent pid
        except (OSError, ValueError):
            continue
    family, found = {root}, []
    for pid in sorted(stats):  # children have larger pids than their parents here (no pid wrap in a test)
        if pid in family or int(stats[pid][2]) in family:
            family.add(pid)
            found.append(f"{pid} {stats[pid][0]} {stats[pid][1]}")
    return found


# --- the stop path never waits for ever ------------------------------------------------------------------

def test_a_stop_whose_peer_hangs_ends_within_the_grace():
    procs = start_two_ranks(STUCK_PEER)
    try:
        assert procs[1].stdout.readline() == "stuck\n"
        wait_for("rank 1 to be stopped", lambda: process_state(procs[1].pid) == "T", timeout=bound(60))
        # rank 0 can go no further than the all-reduce that waits for rank 1, where no Python signal handler runs
        assert procs[0].poll() is None
        procs[0].send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = procs[0].communicate(timeout=bound(60))  # a hang bound, 40x the grace
        assert time.monotonic() - sent >= 3  # it waited the grace (3 s) for the clean stop, then gave up
        assert procs[0].returncode == 1
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: the clean stop did not finish: --grace-seconds 3 ran out: still finishing "
                               "the step in flight after 3 s; its main thread ran "), last
        assert last.endswith("(it was waiting for another process (one may be gone or stuck) or for the disk); "
                             "exiting without it: the last complete checkpoint stays"), last
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_process_bound_to_its_launcher_gets_sigterm_when_the_launcher_is_killed():
    sleep = str(int(bound(300)))  # far past the hang bounds below: only the lifeline's SIGTERM ends it in time
    command = f'"{sys.executable}" "{REPO}/utils/run/lifeline.py" $$ sleep {sleep} & echo $!; wait'
    launcher = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    # bound once lifeline.py, which binds and then execs, runs `sleep`
    wait_for("the bound process to start", lambda: command_line(child)[:1] == ["sleep"], timeout=bound(60),
             every=0.02)
    launcher.kill()
    launcher.wait()
    wait_for("the bound process to end", lambda: not alive(child), timeout=bound(60))
    late = subprocess.run([sys.executable, str(REPO / "utils" / "run" / "lifeline.py"), "1", "sleep", sleep],
                          timeout=bound(60))
    assert late.returncode == -signal.SIGTERM  # its launcher was already gone: it stops at once
