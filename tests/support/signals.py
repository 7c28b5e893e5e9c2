"""Signals as a terminal or a supervisor delivers them."""


def hangup_as_on_a_terminal() -> None:
    """preexec_fn for a launcher a test hangs up: SIGHUP at its default, as a login shell has it. A test runner
    started under nohup passes SIGHUP on ignored, and a signal ignored at start stays ignored (bash cannot trap
    it; train.py keeps it ignored on purpose), so the hang-up tests would wait for a stop that nohup forbids."""
    import signal

    signal.signal(signal.SIGHUP, signal.SIG_DFL)
