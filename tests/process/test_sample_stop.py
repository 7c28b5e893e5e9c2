"""The end-of-run sample (up to --sample-tokens 1000 forwards over a growing context) is no wait a Ctrl-C cannot cut:
the first Ctrl-C ends it, and the run, whose checkpoints are saved, exits 0 (it sampled on, for minutes, and only a
second Ctrl-C ended it, with 130)."""
import signal

from tests.support.paths import REPO
from tests.support.peers import Waiter
from tests.support.waits import wait_for


def test_a_ctrl_c_during_the_final_sample_ends_it_with_the_checkpoints_saved(tmp_path):
    waiter = Waiter([str(REPO / "start_training.sh"), "--config", "test", "--gpus", "0", "--data", "demo",
                     "--max-steps", "2", "--", "--sample-tokens", "1000"], cwd=tmp_path)
    log = tmp_path / "logs" / "test-demo-byte" / "training.log"
    try:  # the last step's save has been handed to the saver: the sample runs beside it
        wait_for("the last save", lambda: (log.exists() and "step-00000002: training blocked" in log.read_text())
                 or waiter.proc.poll() is not None)
        waiter.proc.send_signal(signal.SIGINT)
        code, _ = waiter.finish()
    finally:
        waiter.kill()
    text = log.read_text()
    assert code == 0 and "Traceback" not in waiter.err, waiter.err
    assert "the sample was cut short by a stop signal" in text or "SIGINT" in text, text[-2000:]
    assert (tmp_path / "checkpoints" / "test-demo-byte" / "step-00000002" / "COMPLETE").is_file()
