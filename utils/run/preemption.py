"""Clean stops on SIGTERM/SIGINT/SIGHUP: save, flush the upload and exit 0 within a grace budget.

Preemptible VMs get SIGTERM about 30 s before they vanish; Ctrl-C sends SIGINT; a closed terminal or a
dropped ssh session sends SIGHUP (ignored under nohup, which stays so). The handler only sets a
flag (little else is safe inside a signal handler). Each rank may see the signal at a different moment, so
the training loop asks a `StopVote` at every micro-step and evaluation batch: it all-reduces the flags of
all ranks in the background and answers one call later, so every rank stops at the same micro-step and
none is left waiting in a collective the others skipped, without a host-device sync per micro-step.

    stop = StopRequest(grace_seconds=30).install()
    vote = StopVote(stop, accelerator, deadline)
    for micro in range(accum):
        if vote():
            break
    ...
    uploader.flush(timeout=stop.remaining())
"""
from __future__ import annotations

import math
import signal
import threading
import time
from typing import Callable

from utils.errors import PiconeoxError
from utils.run.lifeline import main_thread_times

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def check_grace_seconds(grace_seconds: float) -> None:
    """--grace-seconds must be a positive, finite number."""
    if not (isinstance(grace_seconds, (int, float)) and math.isfinite(grace_seconds) and grace_seconds > 0):
        raise PiconeoxError(f"--grace-seconds {grace_seconds}: must be a positive number of seconds (default 30)")


class StopRequest:
    """A latch for "stop cleanly": set by a signal or by the trainer, agreed on by all ranks.

    grace_seconds: the budget from the request to the end of the process (save + flush).
    reason: why the stop was requested (None while running). Whether every rank agreed: `StopVote.stopping`.
    """

    def __init__(self, grace_seconds: float = 30.0):
        check_grace_seconds(grace_seconds)
        self.grace_seconds = float(grace_seconds)
        self.reason: str | None = None
        self.by_signal = False  # the stop was asked for by a signal (not by the trainer or another rank)
        self.outcome: int | None = None  # the run's exit code once it is decided: later signals change nothing
        self.saved: int | None = None  # the exit code once the stop's checkpoint is saved (what is left is talk)
        self.doing: str | Callable[[], str] = "finishing the step in flight"  # what the stop is doing, for a grace
        self._requested_at: float | None = None  # that runs out
        self._times_at_request = (0.0, 0.0)  # main_thread_times() then
        self._previous: dict[int, object] = {}

    def install(self) -> StopRequest:
        """Handle SIGTERM, SIGINT and SIGHUP until `uninstall()`; a no-op off the main thread (signals go there
        only). A signal ignored at start (SIGHUP under nohup) stays ignored."""
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Put the handlers back that `install()` replaced. A training process whose outcome is decided ignores the
        stop signals from here on instead: the run is over, and a late Ctrl-C must not turn its exit into a
        failure (the interpreter's exit resets Python handlers to the default, which would die of it)."""
        from utils.run import lifeline

        done = lifeline.is_worker() and self.outcome is not None
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if done else handler)
        self._previous.clear()

    def __enter__(self) -> StopRequest:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame) -> None:
        if self.outcome is not None:  # the run has ended (its summary printed): nothing is left to stop
            from utils.run import lifeline

            if lifeline.is_worker():
                lifeline.exit_now(self.outcome, "")  # with the run's own code, not a failure
            return
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: the user does not want to wait for the clean stop
        if signum == signal.SIGHUP:
            from utils.run.lifeline import detach_terminal

            detach_terminal()  # its terminal is gone: writing there would fail the save
        self.by_signal = self.by_signal or not self.requested
        self.request(f"{signal.Signals(signum).name} received")

    def request(self, reason: str) -> None:
        """Ask for a clean stop (the first reason wins); starts the grace budget."""
        if self.reason is None:
            self.reason = reason
            self._requested_at, self._times_at_request = time.monotonic(), main_thread_times()

    @property
    def requested(self) -> bool:
        """Whether this process was asked to stop (the other ranks may not know yet)."""
        return self.reason is not None

    def remaining(self) -> float | None:
        """Seconds left of the grace budget; None when no stop was requested (no limit)."""
        if self._requested_at is None:
            return None
        return max(0.0, self.grace_seconds - (time.monotonic() - self._requested_at))


    def late(self, since: float, then: tuple[float, float] | None = None) -> str:
        """What a stop whose grace ran out was doing, and where the time went since `since` (time.monotonic() of
        the signal; `then`: main_thread_times() at that moment, else at the request): its main thread running,
        waiting for a CPU (a busy machine, the common reason), or neither (waiting for another process or the
        disk)."""
        doing = self.doing() if callable(self.doing) else self.doing
        seconds = time.monotonic() - since
        ran, queued = (now - before for now, before in zip(main_thread_times(), then or self._times_at_request))
        if queued > max(ran, 0.25 * seconds):
            why = ("the machine is busy: other jobs or a low priority left it little CPU; a longer --grace-seconds or "
                   "a quieter machine lets it finish")
        elif ran > 0.5 * seconds:
            why = "it worked all along: this stop needs a longer --grace-seconds on this machine"
        else:
            why = "it was waiting for another process (one may be gone or stuck) or for the disk"
        return (f"still {doing} after {seconds:.0f} s; its main thread ran {ran:.1f} s and waited {queued:.1f} s for "
                f"a CPU ({why})")


class StopVote:
    """Whether all ranks stop now: a signal or stop request on any rank, or rank 0's time limit.

    Each call all-reduces (max) two flags of CPU tensors over a gloo group of its own: "this rank was asked
    to stop" and "rank 0's clock passed `deadline`" (only rank 0's clock counts, so ranks never disagree
    about time). The all-reduce runs in the background: a call returns the answer of the previous call and
    starts the next one, so every rank stops at the same call, one call after the request, and no call
    waits for a GPU. All ranks must call it at the same points of the loop.

    stopping: True once agreed, identical on every rank. time_up: the agreed stop is rank 0's time limit.
    progress: a time budget's share of the training window done, as rank 0 read it (`progress`, called on rank 0
    only); identical on every rank after each call.
    """

    def __init__(self, stop: StopRequest, accelerator, deadline: float = math.inf, timeout=None,
                 progress: Callable[[], float] | None = None):
        self.stop, self.deadline = stop, deadline
        self.is_main = accelerator.is_main_process
        self.stopping = self.time_up = False
        # A time budget's progress (0..1) as rank 0's clock reads it, carried by the same all-reduce: every rank
        # learns rank 0's value, one call late, and steps with the same learning rate.
        self._read_progress = progress if self.is_main else None
        self.progress = 0.0
        self._group = self._pending = None
        if accelerator.num_processes > 1:
            import torch

            from utils.distributed import cpu_group

            # `timeout` (a timedelta): the training steps' own bound, not torch's 30-minute default, so a hung rank
            # fails this vote as fast as the step's collectives.
            self._group = cpu_group(timeout)
            self._flags = torch.zeros(3, dtype=torch.float64)

    @property
    def group(self):
        """The vote's own gloo group (None in one process)."""
        return self._group

    def _local_flags(self) -> tuple[int, int, float]:
        progress = self._read_progress() if self._read_progress is not None else 0.0
        return int(self.stop.requested), int(self.is_main and time.time() >= self.deadline), progress

    def __call__(self) -> bool:
        if self.stopping:
            return True
        if self._group is None:  # one process: its own flags are the agreement
            requested, self.time_up, self.progress = self._local_flags()
            self.stopping = bool(requested or self.time_up)
            return self.stopping
        import torch
        import torch.distributed as dist

        if self._pending is not None:
            self._pending.wait()
            requested, time_up, progress = self._flags.tolist()
            requested, time_up, self.progress = bool(requested), bool(time_up), max(self.progress, progress)
            if requested or time_up:
                self.stopping, self.time_up = True, time_up and not requested
                if requested:
                    self.stop.request("another rank was asked to stop")
                return True
        self._flags.copy_(torch.tensor(self._local_flags(), dtype=torch.float64))
        self._pending = dist.all_reduce(self._flags, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        return False

    def close(self) -> None:
        """Wait for the all-reduce in flight (every rank started it) before the group goes away."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
