"""A rank's outcome file, as the launcher reads it while the rank writes it (utils/errors.record, outcomes)."""
import io
import threading

from tests.support.bounds import bound
from utils import errors


def test_the_launcher_never_reads_an_outcome_half_written(tmp_path, monkeypatch):
    """A loaded stop test caught the launcher reading a rank's file between its creation and its write:
    `int('')` and a traceback instead of the clean stop. The launcher sees no file, then the whole one."""
    monkeypatch.setenv(errors.STATUS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    writing, resume = threading.Event(), threading.Event()
    real_fdopen = errors.os.fdopen

    class Slow(io.TextIOWrapper):
        def write(self, text):  # the first half, a pause the test controls, the rest
            super().write(text[:1])
            self.flush()
            writing.set()
            resume.wait(bound(15))
            return super().write(text[1:])

    def slow_fdopen(fd, mode="r", **kwargs):
        return Slow(real_fdopen(fd, mode.replace("w", "wb"), buffering=0), **kwargs, write_through=True)

    monkeypatch.setattr(errors.os, "fdopen", slow_fdopen)
    writer = threading.Thread(target=errors.record, args=(130, "error: interrupted"))
    writer.start()
    try:
        assert writing.wait(bound(15))
        assert errors.outcomes(tmp_path) == []  # mid-write: nothing yet, not a broken file
    finally:
        resume.set()
        writer.join(bound(15))
    assert errors.outcomes(tmp_path) == [(130, "error: interrupted")]
    assert errors.record(0, "") and errors.outcomes(tmp_path) == [(130, "error: interrupted")]  # the first stays
    assert [p.name for p in tmp_path.iterdir()] == ["rank-00001"]  # no temp file left
