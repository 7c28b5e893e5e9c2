"""A time budget: durations, the schedule at each share of the training time, the clock of a budgeted run (a fake
clock: every reading is chosen), what a resume keeps, and the one line when start-up left no time."""
import pytest
import torch

from configs.flags import overrides_from_args, parse_args
from configs.plan import format_plan, plan
from configs.presets import resolve_config
from utils.errors import PiconeoxError
from utils.optim import build_scheduler, on_time
from utils.run.allocation import slurm_time_left
from utils.run.budget import TimeBudget, for_run, parse_duration


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("text, seconds", [("600", 600), ("600s", 600), ("90m", 5400), ("1h30m", 5400),
                                           ("1.5h", 5400), ("2m30s", 150), (" 45 ", 45), ("0", 0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "-5", "1d", "nan", "inf", "90 m", "1h30", "m", "9999999999"])
def test_bad_durations_are_one_line_naming_the_flag(text):
    with pytest.raises(PiconeoxError, match=r"^--time-budget .*: expected seconds or a duration such as 600, 600s"):
        parse_duration(text)
    args = parse_args(["--time-budget", text])
    with pytest.raises(PiconeoxError, match=r"^--time-budget "):
        overrides_from_args(args)


def test_the_setting_takes_durations_too_and_names_itself():
    assert resolve_config("test", overrides={"train.time_budget_s": "1h30m"}).train.time_budget_s == 5400
    assert resolve_config("test", overrides=overrides_from_args(parse_args(["--time-budget", "90m"]))
                          ).train.time_budget_s == 5400
    with pytest.raises(PiconeoxError, match=r"^train.time_budget_s='soon': expected seconds"):
        resolve_config("test", overrides={"train.time_budget_s": "soon"})


@pytest.mark.parametrize("progress, wsd, cosine", [
    (0.0, 1.0, 1.0), (0.5, 1.0, 0.55), (0.8, 1.0, 0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(0.8 * torch.pi)))),
    (0.9, 0.55, None), (1.0, 0.1, 0.1), (1.5, 0.1, 0.1)])
def test_the_schedule_at_each_share_of_the_training_time(progress, wsd, cosine):
    """After the warmup steps: wsd holds the peak to 1 - decay_fraction (0.2 here), then falls linearly to the
    floor (0.1) at the budget; cosine falls over the whole window. Progress past 1 stays at the floor."""
    assert on_time("wsd", 100, progress, 10, 0.1, 0.2) == pytest.approx(wsd)
    if cosine is not None:
        assert on_time("cosine", 100, progress, 10, 0.1, 0.2) == pytest.approx(float(cosine))


def test_warmup_counts_steps_and_the_lower_factor_wins():
    assert [on_time("wsd", s, 0.0, 4, 0.1, 0.2) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert on_time("wsd", 0, 1.0, 4, 0.1, 0.2) == pytest.approx(0.1)  # a budget too short for the warmup: decayed


def test_a_scheduler_follows_the_budget_clock():
    """LambdaLR steps through `progress` as a fake clock moves; its state holds no function (a resume with or
    without a budget reads the same keys)."""
    clock = FakeClock()
    budget = TimeBudget(100, "--time-budget 100", started=clock.now, clock=clock)
    budget.start_training(now=clock.now)  # no reserve: the window is the whole budget
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, 0, 10, 0.1, "wsd", 0.2, progress=lambda: budget.progress)
    lrs = []
    for now in (10, 50, 85, 90, 95, 100):
        clock.now = 1000.0 + now
        budget.progress = budget.progress_at()
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([1.0, 1.0, 0.775, 0.55, 0.325, 0.1])
    assert sched.state_dict()["lr_lambdas"] == [None]


def test_the_window_ends_a_reserve_and_a_step_before_the_budget():
    clock = FakeClock()
    budget = TimeBudget(100, "--time-budget 100", started=clock.now - 10, clock=clock)  # 10 s of start-up
    budget.plan_finish(eval_s=5, sample_s=2, save_s=0.5)
    reserve = 5 + 2 + 0.5 + 1.5 + 2  # FINISH_S, and 2% of the budget
    assert budget.reserve == pytest.approx(reserve)
    budget.start_training()
    window = 90 - reserve
    clock.now += window / 2
    assert budget.progress_at() == pytest.approx(0.5)
    budget.note_step(window / 4)  # the next step would end three quarters in
    assert budget.progress_at() == pytest.approx(0.75)
    budget.plan_finish(eval_s=1)  # a measured evaluation shortens the reserve: the window grows, and progress
    assert budget.progress_at() == pytest.approx(0.75)  # never goes back
    budget.plan_finish(eval_s=5)
    clock.now = budget.stop_at() - window / 4
    assert budget.progress_at() == 1.0


def test_a_resume_keeps_the_time_spent():
    """A checkpoint saved after 40 s at progress 0.5: the resumed process has the 60 s left, not 100, and its
    schedule goes on from 0.5 to 1 over them."""
    clock = FakeClock()
    first = TimeBudget(100, "--time-budget 100", started=clock.now, clock=clock)
    first.progress = 0.5
    clock.now += 40
    saved = first.state_dict()
    assert saved == {"spent_s": pytest.approx(40), "progress": 0.5}
    clock.now += 500  # the machine was gone a while: the budget does not count it
    second = TimeBudget(100, "--time-budget 100", started=clock.now, clock=clock)
    second.load_state_dict(saved)
    assert second.end() == pytest.approx(clock.now + 60)
    second.start_training()
    clock.now += 30
    assert second.progress_at() == pytest.approx(0.75)
    assert second.spent() == pytest.approx(70)


def test_a_budget_shorter_than_start_up_is_one_line():
    clock = FakeClock()
    budget = TimeBudget(5, "--time-budget 5", started=clock.now - 7.25, clock=clock)
    budget.plan_finish(eval_s=1)
    with pytest.raises(PiconeoxError, match=r"^--time-budget 5: no time left to train: 7.2 s of the 5 s budget are "
                                            r"spent \(start-up 7.2 s\) and the final evaluation and save need about "
                                            r"\d+.\d s more; give a budget of at least \d+ s$"):
        budget.start_training()


def test_a_finished_budget_is_not_trained_again():
    budget = TimeBudget(100, "--time-budget 100", started=0.0, clock=FakeClock(0.0))
    budget.load_state_dict({"spent_s": 99.0, "progress": 1.0})
    with pytest.raises(PiconeoxError, match="already spent its budget .* raise the budget to train on"):
        budget.start_training()


def test_the_final_sample_shrinks_to_what_is_left():
    clock = FakeClock()
    budget = TimeBudget(100, "--time-budget 100", started=clock.now, clock=clock)
    budget.plan_finish(save_s=0.5)
    budget.token_s = 0.01
    clock.now += 100 - 0.5 - 1.5 - 1.0  # one second left after the save
    assert budget.sample_tokens(200) == 100
    clock.now += 5
    assert budget.sample_tokens(200) == 0


def test_slurm_time_left():
    assert slurm_time_left("1-02:03:04\n") == 93784
    assert slurm_time_left("1:00:00") == 3600
    assert slurm_time_left("5:00") == 300
    assert slurm_time_left("UNLIMITED") is None and slurm_time_left("NOT_SET") is None


def test_the_plan_shows_the_budget():
    cfg = resolve_config("test", overrides={"train.time_budget_s": "90m"})
    text = format_plan(plan(cfg, gpus=0), cfg.train.time_budget_s)
    assert "time budget       1h 30m (5400 s), start-up to final save: as many steps as fit (the lr decay" in text
    assert "  steps    " not in text and "tokens in total" not in text  # unknown before the run


def test_a_wsd_decay_that_rounds_to_no_step_is_refused():
    with pytest.raises(PiconeoxError, match=r"^train.decay_fraction=0.001 of train.max_steps=200 rounds to 0 decay "
                                            r"steps: lr_schedule wsd would never decay; use decay_fraction >= 0.005"):
        resolve_config("test", overrides={"train.lr_schedule": "wsd", "train.decay_fraction": "0.001"})
    with pytest.raises(PiconeoxError, match=r"^train.warmup_steps=300 takes every step: lr_schedule wsd"):
        resolve_config("test", overrides={"train.lr_schedule": "wsd", "train.warmup_steps": "300"})
    ok = {"train.lr_schedule": "wsd", "train.decay_fraction": "0.005"}
    assert resolve_config("test", overrides=ok).train.decay_fraction == 0.005
    budgeted = {"train.lr_schedule": "wsd", "train.decay_fraction": "0.001", "train.time_budget_s": "60"}
    assert resolve_config("test", overrides=budgeted).train.time_budget_s == 60  # the clock decays, not steps


def test_a_slurm_limit_is_the_budget_less_the_grace_or_the_signal_lead(caplog):
    import logging

    log = logging.getLogger("budget-test")
    job = {"SLURM_JOB_ID": "4242"}
    with caplog.at_level(logging.INFO, logger="budget-test"):
        budget = for_run(0, 30, True, log, env=job, time_left=lambda env: 600.0)
    assert budget.this_process and budget.max_steps_too
    assert budget.end() - budget.clock() == pytest.approx(570, abs=1)
    assert "time budget from Slurm job 4242: its time limit is in 10m (600 s), less --grace-seconds 30" in caplog.text
    led = for_run(0, 30, True, log, env={**job, "PICONEOX_SIGNAL_LEAD_S": "120"}, time_left=lambda env: 600.0)
    assert led.end() - led.clock() == pytest.approx(480, abs=1)
    assert for_run(0, 30, True, log, env=job, time_left=lambda env: None) is None  # UNLIMITED
    given = for_run(90, 30, True, log, env=job, time_left=lambda env: 600.0)
    assert given.seconds == 90 and not given.max_steps_too  # --time-budget wins


def test_the_budget_counts_from_the_launchers_start(caplog, monkeypatch):
    """start_training.sh exports its start time: its preflight and the launch are inside the budget. A value that
    is not a time before this process (garbage, the future, days ago) leaves the process's own start."""
    import logging
    import time

    import utils.run.budget

    monkeypatch.setattr(utils.run.budget, "process_age", lambda: 3.0)  # a pytest worker may be minutes old
    log = logging.getLogger("budget-test")
    with caplog.at_level(logging.INFO, logger="budget-test"):
        launched = for_run(60, 30, True, log, env={"PICONEOX_LAUNCHED_AT": f"{time.time() - 25:.3f}"})
    assert launched.spent() == pytest.approx(25, abs=2)
    assert "counted from start_training.sh's start (25." in caplog.text
    caplog.clear()
    for bad in ("soon", "nan", f"{time.time() + 50:.3f}", f"{time.time() - 3 * 86400:.3f}", ""):
        with caplog.at_level(logging.INFO, logger="budget-test"):
            own = for_run(60, 30, True, log, env={"PICONEOX_LAUNCHED_AT": bad})
        assert own.spent() == pytest.approx(3, abs=2), bad  # the process's own age, not the bad value's
        assert "counted from this process's start" in caplog.text


def test_a_budget_json_holds_what_a_run_writes_or_is_refused():
    from utils.ckpt.ranges import part_problem

    assert part_problem("budget", {"spent_s": 12.5, "progress": 0.4}, 7) is None
    assert "spent_s -1 is not a finite number of seconds" in part_problem("budget", {"spent_s": -1, "progress": 0}, 7)
    assert "progress 2 is not a number in 0..1" in part_problem("budget", {"spent_s": 1, "progress": 2}, 7)
    assert "progress True" in part_problem("budget", {"spent_s": 1, "progress": True}, 7)
