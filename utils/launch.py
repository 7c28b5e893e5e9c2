"""`accelerate launch` that keeps piconeox's exit codes: python utils/launch.py <accelerate launch args> train.py ...

The same flags as `python -m accelerate.commands.launch` (start_training.sh prints and runs this line). What
differs is only how a failed run ends: the training processes record their exit code and `error:` line
(utils/errors.py), and this prints that line once and exits with that code (2 for a refusal, 3 for a
checkpoint that never reached the bucket) instead of accelerate's exit 1 or torchrun's ChildFailedError
traceback. A crash that recorded nothing (a real bug) keeps its own traceback, printed by the worker.

A stop signal to the launcher (Slurm's scancel, systemd and container runtimes signal every process of the job at
once) is a clean stop too: it is passed on to the training processes as SIGTERM (a later Ctrl-C as SIGINT, which
ends them at once), and the launcher waits for their exit codes; torch elastic's own handler, which raised a
SignalException traceback, is left out.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the repository root on the path, like train.py has it
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # not utils/: its evaluate.py would shadow the package

from utils import errors  # noqa: E402
from utils.run.lifeline import children_of  # noqa: E402


def failed_code(exc: BaseException) -> int:
    """The exit code inside accelerate's or torchrun's way of saying that a training process failed."""
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, subprocess.CalledProcessError):
        return exc.returncode
    failures = getattr(exc, "failures", None)  # torchrun's ChildFailedError: {rank: ProcessFailure}
    if failures:
        return next(iter(failures.values())).exitcode or 1
    if isinstance(getattr(exc, "sigval", None), signal.Signals):  # torch elastic's SignalException: a stop signal
        return 0  # to the whole group, and its agent waited for the workers' clean stop
    raise exc


_peer_waits: list = []  # the launcher's PeerWait for other machines, once made (its `interrupt` knows if it waits)


def pass_on_stops(status: Path) -> None:
    """SIGTERM/SIGINT/SIGHUP to the launcher reach the training processes as a clean stop (SIGTERM; a Ctrl-C after
    an earlier signal as SIGINT: the second Ctrl-C); once they have all ended the launcher just finishes, and before
    any started, it is interrupted. A signal ignored at start (SIGHUP under nohup) stays ignored."""
    signalled = []

    def stop(signum, frame):
        forward = signal.SIGINT if signum == signal.SIGINT and signalled else signal.SIGTERM
        signalled.append(signum)
        workers = children_of(os.getpid())
        for pid in workers:
            try:
                os.kill(pid, forward)
            except ProcessLookupError:
                pass
        if not workers and not errors.outcomes(status):
            for wait in _peer_waits:  # the line printed says a stop ends the wait: it does, with the wait's line
                wait.interrupt()
            raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, stop)
    os.environ["PET_SIGNALS_TO_HANDLE"] = "SIGQUIT"  # torchrun --signals-to-handle: its agent leaves these to us


def wait_for_machines(args):
    """Several machines: the launcher's rendezvous (torchrun's, in C++, where no signal handler runs) waits for the
    others; one line says for what and for how long, and a PeerWait lets a stop signal end it at once."""
    from utils.run.rendezvous import DEFAULT_TIMEOUT_SECONDS, PeerWait

    if (args.num_machines or 1) <= 1:
        return contextlib.nullcontext()
    conf = dict(item.partition("=")[::2] for item in (args.rdzv_conf or "").split(",") if item)
    timeout = float(conf.get("timeout", DEFAULT_TIMEOUT_SECONDS))
    where = f"{args.main_process_ip}:{args.main_process_port}"
    what = (f"machine 0 at {where} (this is machine {args.machine_rank} of {args.num_machines})" if args.machine_rank
            else f"the other {args.num_machines - 1} machine(s) at {where} (this is machine 0)")
    conf["timeout"] = str(int(timeout) + 60)  # torchrun's own bound a minute later: ours says it in one line
    args.rdzv_conf = ",".join(f"{k}={v}" for k, v in conf.items())
    fix = "start it with the same --main-process-ip and --main-process-port" if args.machine_rank else \
        "start them with --main-process-ip and --main-process-port of this machine"
    wait = PeerWait(what, timeout, fix, waiting=lambda: not children_of(os.getpid()), own_handlers=False,
                    record=False, announce=f"start_training.sh: waiting for {what}, at most {timeout:g} s "
                    "(--rendezvous-timeout-seconds); Ctrl-C stops waiting")
    _peer_waits.append(wait)  # the launcher's stop handler runs in the main thread, maybe before the wait's thread
    return wait


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser

    parser = launch_command_parser()
    parser.error = lambda message: parser.exit(2, f"error: {message} (see accelerate launch --help)\n")  # one line
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    # torchrun's agent logs every worker's exit as an error and SIGTERMs the rest with warnings; the worker's own
    # line (or its traceback, for a crash) says what happened. Each of its loggers sets its own level when imported,
    # so their records stop at the parents instead (a handler there keeps logging's last-resort printer away).
    for name in ("torch.distributed.elastic", "torch.distributed.launcher"):
        logging.getLogger(name).addHandler(logging.NullHandler())
        logging.getLogger(name).propagate = False
    with tempfile.TemporaryDirectory(prefix="piconeox-status-") as folder:
        os.environ[errors.STATUS_DIR_ENV] = folder
        pass_on_stops(Path(folder))
        try:
            with wait_for_machines(args):
                launch_command(args)
            code = 0
        except (SystemExit, subprocess.CalledProcessError, Exception) as e:
            code = failed_code(e)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # the workers are gone: a late signal changes
            if signal.getsignal(sig) is not signal.SIG_IGN:           # nothing (nor kills the exit as it would)
                signal.signal(sig, signal.SIG_IGN)
        recorded = errors.collected(Path(folder))
    if recorded is not None:
        print(recorded[1], file=sys.stderr, flush=True)
        return recorded[0]
    if code:
        print(f"error: a training process failed with exit code {code} (its output is above)", file=sys.stderr)
    return code


if __name__ == "__main__":
    try:
        errors.exit_process(main())
    except KeyboardInterrupt:  # Ctrl-C before the training processes started (start_training.sh forwards it here)
        print("error: interrupted before the training processes started; nothing was trained", file=sys.stderr)
        sys.exit(errors.INTERRUPTED)
