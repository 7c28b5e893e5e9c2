"""Telling a full disk from other failures, whatever shape the failure arrives in."""
import errno

from utils.diskfull import is_no_space


class Wrapper(Exception):
    """The shape of DCP's CheckpointException: per-rank failures in `failures`."""

    def __init__(self, failures):
        super().__init__("checkpoint failed")
        self.failures = failures


def test_a_wrapped_failure_whose_context_is_its_wrapper_ends_the_walk():
    """A loader that refuses inside DCP's read re-raises with the wrapper as the refusal's context: a cycle that a
    walk keeping one `seen` per call followed until RecursionError (a traceback instead of the refusal's line)."""
    inner = ValueError("refused to load")
    outer = Wrapper({0: (inner, "tb")})
    inner.__context__ = outer
    assert is_no_space(outer) is False


def test_enospc_is_found_inside_a_wrapper_and_through_causes():
    full = OSError(errno.ENOSPC, "No space left on device")
    assert is_no_space(Wrapper({1: full}))
    try:
        try:
            raise full
        except OSError as e:
            raise RuntimeError("save failed") from e
    except RuntimeError as e:
        assert is_no_space(e)
    assert not is_no_space(RuntimeError("other"))
