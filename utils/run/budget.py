"""A run's time budget: the wall-clock seconds from the run's start (start_training.sh's, else this process's) to
its end, start-up, evals and the final save included. The learning-rate schedule reads `progress`, the share of
the training window done (0..1), so its decay ends where the budget does, on any box.

    budget = TimeBudget(600, "--time-budget 10m")    # the clock starts at the run's start (`run_age`)
    budget.start_training(now)                       # after set-up: the window runs to the budget's end - reserve
    p = budget.progress_at(now)                      # rank 0 reads its clock; the stop vote carries p to every rank
    budget.state_dict()                              # {"spent_s", "progress"}: a resume keeps the time already spent

Only rank 0's clock counts: every rank learns rank 0's progress through `utils/run/preemption.StopVote`, so all of
them take the same steps with the same learning rates and stop at the same step. The reserve is what the run still
does after its last step (the final evaluation, the final save and the sample): estimated at the start, then
measured as evaluations and saves happen.
"""
from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Mapping

from utils.errors import PiconeoxError
from utils.run.allocation import slurm_seconds_left

LONGEST = 366 * 24 * 3600.0  # a year: longer is a typo (and overflows nothing, but trains nothing sensible)
NUMBER = r"(\d+(?:\.\d+)?)"
DURATION = re.compile(f"(?:{NUMBER}h)?(?:{NUMBER}m)?(?:{NUMBER}s)?")
MIN_WINDOW = 1.0  # seconds of training a budget must leave after start-up and the reserve


def parse_duration(value, name: str = "--time-budget") -> float:
    """Seconds from `600`, `600s`, `90m`, `1h30m`, `1.5h` (a number alone is seconds); one line naming `name` and
    the value otherwise. 0 means no budget."""
    text = str(value).strip().lower()
    seconds = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif re.fullmatch(r"\d+(?:\.\d+)?", text):
        seconds = float(text)
    elif text and (m := DURATION.fullmatch(text)):
        hours, minutes, secs = (float(g) if g else 0.0 for g in m.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds is None or not math.isfinite(seconds) or not 0 <= seconds <= LONGEST:
        shown = f"{name}={value!r}" if "." in name else f"{name} {value!r}"  # a setting, or a flag
        raise PiconeoxError(f"{shown}: expected seconds or a duration such as 600, 600s, 90m or 1h30m "
                            f"(at most a year; 0 = no budget)")
    return seconds


def describe(seconds: float) -> str:
    """`1h 30m (5400 s)`-style words for a budget."""
    whole = int(round(seconds))
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    words = " ".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or f"{seconds:g}s"
    return f"{words} ({seconds:g} s)" if whole >= 60 else f"{seconds:g} s"


def process_age() -> float:
    """Seconds since this process started (Linux: /proc/self/stat against the boot clock), else 0: the budget then
    counts from the first call, a few tenths of a second late."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time, ticks since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


LAUNCHED_ENV = "PICONEOX_LAUNCHED_AT"  # start_training.sh's start (Unix time): its preflight is in the budget too


def run_age(env: Mapping[str, str] = os.environ) -> tuple[float, str]:
    """(seconds since the run started, since what): start_training.sh's start when it launched this process (its
    preflight and the launcher count against the budget), else this process's own start (`process_age`)."""
    own = process_age()
    try:
        launched = time.time() - float(env.get(LAUNCHED_ENV, ""))
    except ValueError:
        launched = math.nan
    if own <= launched <= own + 3600:  # a launcher's start is before this process's, and not hours before
        return launched, "start_training.sh's start"
    return own, "this process's start"


class TimeBudget:
    """The clock of a budgeted run, on rank 0 (the other ranks keep only the agreed `progress`).

    seconds: the budget; spent_before: what earlier processes of this run spent (from the checkpoint); this
    process may use `seconds - spent_before`, or all of `seconds` when `this_process` (a Slurm job's end: a requeued
    job has a new one). progress: the schedule's share of the training window as every rank agreed it (what the
    schedule reads and the checkpoint keeps). max_steps_too: train.max_steps also ends the run, and the lower of the
    step-counted and the clock's lr wins (a Slurm limit the user may not have meant as the run's length).
    """

    def __init__(self, seconds: float, source: str, started: float | None = None, clock=time.monotonic,
                 this_process: bool = False):
        self.seconds, self.source, self.clock = float(seconds), source, clock
        self.started = clock() - run_age()[0] if started is None else started
        self.this_process = self.max_steps_too = this_process
        self.spent_before = 0.0
        self.progress = 0.0
        self.reserve = 0.0  # seconds the run needs after its last step
        self._finish: dict[str, float] = {}  # what makes up the reserve (plan_finish)
        self.token_s = 0.0  # seconds a token of the final sample takes (measured at the start)
        self.step_s = 0.0  # a training step's recent wall time (note_step)
        self._measured = 0.0  # rank 0's own reading, ahead of the agreed `progress` by one vote
        self._window: tuple[float, float] | None = None  # (this process's training start, progress there)

    # --- the checkpointed part ------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"spent_s": self.spent(), "progress": self.progress}

    def load_state_dict(self, state: dict) -> None:
        self.spent_before, self.progress = float(state["spent_s"]), float(state["progress"])
        self._measured = self.progress

    # --- rank 0's clock -------------------------------------------------------------------------------------

    def spent(self, now: float | None = None) -> float:
        """Seconds of the budget used: earlier processes' plus this one's since its start."""
        return self.spent_before + ((self.clock() if now is None else now) - self.started)

    def end(self) -> float:
        """The clock's reading when the budget runs out."""
        return self.started + self.seconds - (0.0 if self.this_process else self.spent_before)

    def start_training(self, now: float | None = None) -> None:
        """Open the training window at `now`: it ends `reserve` seconds before the budget does. One line when
        start-up left no time to train (or an earlier run of this checkpoint spent the budget)."""
        now = self.clock() if now is None else now
        reserve = self.reserve
        left = self.end() - now
        if self.progress >= 1.0 and not self.this_process:
            raise PiconeoxError(f"{self.source}: the checkpoint's run already spent its budget "
                                f"({self.spent_before:.1f} s of {self.seconds:g} s) and finished its schedule; raise "
                                "the budget to train on")
        if left - reserve < MIN_WINDOW:
            before = f"; the checkpoint's earlier runs spent {self.spent_before:.1f} s" if self.spent_before else ""
            raise PiconeoxError(
                f"{self.source}: no time left to train: {self.spent(now):.1f} s of the {self.seconds:g} s budget are "
                f"spent (start-up {now - self.started:.1f} s{before}) and the final evaluation and save need about "
                f"{reserve:.1f} s more; give a budget of at least {self.spent(now) + reserve + 10 * MIN_WINDOW:.0f} s")
        self._window = (now, self.progress)

    def plan_finish(self, **seconds: float) -> None:
        """The reserve from what the run still does after its last step: the final evaluation (`eval_s`), the
        sample (`sample_s`) and the save (`save_s`), each estimated at the start and replaced when measured, plus
        FINISH_S and 2% of the budget for what is neither."""
        self._finish.update(seconds)
        self.reserve = sum(self._finish.values()) + FINISH_S + 0.02 * self.seconds

    def note_step(self, seconds: float) -> None:
        """A step's wall time: the window closes one (recent, averaged) step early, so the last step ends in it."""
        self.step_s = seconds if not self.step_s else 0.8 * self.step_s + 0.2 * seconds

    def sample_deadline(self) -> float:
        """When the final sample must end: the budget's end less the save's share of the reserve and FINISH_S."""
        return self.end() - self._finish.get("save_s", 0.0) - FINISH_S

    def sample_tokens(self, wanted: int) -> int:
        """How many of the final sample's `wanted` tokens fit in what is left of the budget (`token_s` each)."""
        left = self.sample_deadline() - self.clock()
        return wanted if not self.token_s else max(0, min(wanted, int(left / self.token_s)))

    def stop_at(self) -> float:
        """When the last step should end: the budget's end less the reserve."""
        return self.end() - self.reserve

    def progress_at(self, now: float | None = None) -> float:
        """The share of the training window done at `now` (rank 0's clock), 0..1; it never goes back, even when
        the reserve grows."""
        if self._window is None:
            return self._measured
        now = (self.clock() if now is None else now) + self.step_s  # where the next step would end: the last step
        t0, p0 = self._window                                         # is the one that ends within the window
        span = self.stop_at() - t0
        share = 1.0 if span <= 0 else (now - t0) / span
        self._measured = max(self._measured, min(1.0, p0 + (1.0 - p0) * share))
        return self._measured


SIGNAL_LEAD_ENV = "PICONEOX_SIGNAL_LEAD_S"
FINISH_S = 1.5  # the final save's own work, final/, the loss plot and the summary of a small model on a CPU


def for_run(seconds: float, grace_seconds: float, is_main: bool, log, env: Mapping[str, str] = os.environ,
            time_left: Callable[[Mapping[str, str]], float | None] = slurm_seconds_left) -> TimeBudget | None:
    """The run's budget: train.time_budget_s; else, inside a Slurm job with a time limit (`time_left`), the job's
    end less the grace, or less the batch script's signal lead when longer (rank 0 asks squeue; every rank learns
    its answer); else None. Says which in the log."""
    from utils.distributed import broadcast_object

    age, since = run_age(env)
    if seconds:
        log.info(f"time budget {describe(seconds)} (train.time_budget_s), counted from {since} ({age:.1f} s ago): "
                 "training ends in time for the final evaluation, save and sample")
        return TimeBudget(seconds, f"--time-budget {seconds:g}", started=time.monotonic() - age)
    left = broadcast_object(time_left(env) if is_main else None)
    if left is None:
        return None
    lead = env.get(SIGNAL_LEAD_ENV, "")  # configs/slurm/train.sbatch's --signal=B:TERM@N comes N s before the end
    before, why = grace_seconds, f"--grace-seconds {grace_seconds:g}"
    if re.fullmatch(r"\d{1,6}", lead) and int(lead) > grace_seconds:
        before, why = float(lead), f"{SIGNAL_LEAD_ENV}={lead} (the batch script's stop signal comes then)"
    budget = TimeBudget(age + left - before, f"Slurm job {env.get('SLURM_JOB_ID')}'s time limit less "
                        f"{before:g} s", started=time.monotonic() - age, this_process=True)
    log.info(f"time budget from Slurm job {env.get('SLURM_JOB_ID')}: its time limit is in {describe(left)}, less "
             f"{why}: the lr schedule's decay ends there (or at max_steps, if sooner), then the final save; "
             "--time-budget sets another")
    return budget
