"""Clean stops on SIGTERM/SIGINT: save, flush the upload and exit 0 within a grace budget.

Preemptible VMs get SIGTERM about 30 s before they vanish; Ctrl-C sends SIGINT. The handler only sets a
flag (little else is safe inside a signal handler); the training loop looks at it every micro-step and
inside evaluation, so a long gradient accumulation or eval never delays the stop by more than one
forward/backward. Each rank may see the signal at a different moment, so the decision is all-reduced
(max of a 0/1 flag) at the same point on every rank: all ranks stop at the same micro-step, and none
is left waiting in a collective the others skipped.

    stop = StopRequest(grace_seconds=30).install()
    for micro in range(accum):
        if stop.agreed(accelerator):
            break
    ...
    uploader.flush(timeout=stop.remaining())
"""
from __future__ import annotations

import math
import signal
import threading
import time

from utils.errors import PiconeoxError

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """A latch for "stop cleanly": set by a signal or by the trainer, agreed on by all ranks.

    grace_seconds: the budget from the request to the end of the process (save + flush).
    reason: why the stop was requested (None while running).
    stopping: True once `agreed()` returned True; identical on every rank, unlike `requested`.
    """

    def __init__(self, grace_seconds: float = 30.0):
        if not (isinstance(grace_seconds, (int, float)) and math.isfinite(grace_seconds) and grace_seconds > 0):
            raise PiconeoxError(f"--grace-seconds {grace_seconds}: must be a positive number of seconds (default 30)")
        self.grace_seconds = float(grace_seconds)
        self.reason: str | None = None
        self.stopping = False
        self._requested_at: float | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> StopRequest:
        """Handle SIGTERM and SIGINT until `uninstall()`; a no-op off the main thread (signals go there only)."""
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Put the handlers back that `install()` replaced."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def __enter__(self) -> StopRequest:
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: the user does not want to wait for the clean stop
        self.request(f"{signal.Signals(signum).name} received")

    def request(self, reason: str) -> None:
        """Ask for a clean stop (the first reason wins); starts the grace budget."""
        if self.reason is None:
            self.reason = reason
            self._requested_at = time.monotonic()

    @property
    def requested(self) -> bool:
        """Whether this process was asked to stop (the other ranks may not know yet)."""
        return self.reason is not None

    def agreed(self, accelerator) -> bool:
        """True when any rank was asked to stop. Every rank must call this at the same point of the loop."""
        if not self.stopping:
            if accelerator.num_processes == 1:
                self.stopping = self.requested
            else:
                import torch

                flag = torch.tensor(int(self.requested), device=accelerator.device)
                self.stopping = bool(accelerator.reduce(flag, "max").item())
                if self.stopping:
                    self.request("another rank was asked to stop")
        return self.stopping

    def remaining(self) -> float | None:
        """Seconds left of the grace budget; None when no stop was requested (no limit)."""
        if self._requested_at is None:
            return None
        return max(0.0, self.grace_seconds - (time.monotonic() - self._requested_at))
