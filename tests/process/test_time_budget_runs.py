"""train.py with --time-budget as a process (the budget counts from the process's own start): a budget start-up
eats is one line and leaves nothing behind; a budgeted run stopped and resumed ends at the same total budget."""
import json
import re
import signal
import subprocess
import sys

import pytest

from tests.support.bounds import bound
from tests.support.paths import REPO
from tests.support.training import TINY
from tests.support.waits import wait_for
from utils.ckpt.format import latest_complete

pytestmark = pytest.mark.usefixtures("one_thread")


def argv(tmp_path, data, *extra) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), *TINY, "--data", str(data), "--output-dir", str(tmp_path / "ckpt"),
            "--log-dir", str(tmp_path / "logs"), "--run-name", "run", "--sample-tokens", "0", *extra]


def test_a_budget_shorter_than_start_up_is_one_line_and_leaves_nothing(tmp_path, tiny_data):
    done = subprocess.run(argv(tmp_path, tiny_data, "--time-budget", "1"), capture_output=True, text=True,
                          timeout=bound(150), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert re.fullmatch(r"error: --time-budget 1: no time left to train: \d+\.\d s of the 1 s budget are spent "
                        r"\(start-up \d+\.\d s\) and the final evaluation and save need about \d+\.\d s more; give a "
                        r"budget of at least \d+ s", errors[0]), errors[0]
    assert not (tmp_path / "ckpt" / "run").exists() and not (tmp_path / "logs" / "run").exists()


def used(log: str) -> tuple[float, float]:
    """(seconds of the budget used in all, by the last process) from the run's closing budget line."""
    m = re.findall(r"([\d.]+) s of the [\d.]+ s budget used, start-up and final save included \(this process: "
                   r"([\d.]+) s\)", log)
    assert m, log[-2000:]
    return float(m[-1][0]), float(m[-1][1])


def test_a_resumed_budgeted_run_ends_at_the_same_total_budget(tmp_path, tiny_data):
    """Stopped by SIGTERM once its first checkpoint is complete, then resumed with the same budget: the second
    process gets what the first left (the checkpoint's budget.json), and its schedule ends at the budget."""
    budget = 90  # two start-ups and a final save: a loaded box's start-up is several times an idle one's
    common = ("--time-budget", str(budget), "--save-every", "2", "--eval-every", "1000", "--max-steps", "10")
    first = subprocess.Popen(argv(tmp_path, tiny_data, *common), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, cwd=tmp_path)
    run_dir = tmp_path / "ckpt" / "run"
    wait_for("a complete checkpoint or the end",
             lambda: first.poll() is not None or (run_dir.is_dir() and latest_complete(run_dir)), timeout=bound(150))
    assert first.poll() is None, first.communicate()[1][-2000:]  # still training: the budget is not spent yet
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=bound(150))
    assert first.returncode == 0, err[-2000:]
    stopped = latest_complete(run_dir)
    saved = json.loads((stopped / "budget.json").read_text())
    assert 0 < saved["spent_s"] < budget and 0 <= saved["progress"] < 1

    second = subprocess.run(argv(tmp_path, tiny_data, *common, "--resume", "auto"), capture_output=True, text=True,
                            timeout=bound(150), cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-2000:]
    log = (tmp_path / "logs" / "run" / "training.log").read_text()
    assert "stopped at step" in log and "time budget of 1m 30s (90 s) reached" in log  # max_steps 10 was no limit
    total, this_process = used(log)
    assert total == pytest.approx(saved["spent_s"] + this_process, abs=0.2)  # the first process's time counted
    final = json.loads((run_dir / "final" / "budget.json").read_text())
    assert final["progress"] == 1.0 and saved["spent_s"] < final["spent_s"] <= total  # saved before the sample
    assert latest_complete(run_dir).name > stopped.name  # it trained on after the resume
