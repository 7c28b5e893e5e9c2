"""The project's user-error class and the one way a CLI reports it.

Raise PiconeoxError for anything the user can fix (bad flag, bad file, mismatched data). Every CLI's `main`
is wrapped in `cli`, which prints `error: <message>` to stderr and exits 2, so the message must be one clear
line naming the bad value and what is allowed. Never put credentials in the message. The CLIs parse their flags
with CliParser, so a flag mistake is that same one line too (argparse would print its whole usage first).
"""
from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable

from utils import exit_status


class PiconeoxError(Exception):
    """A user-fixable problem, reported as one line without a traceback."""


class CliParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line `error: ...` and exit 2, like every other user mistake."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")



class Interrupted(PiconeoxError):
    """Ctrl-C, saying what was kept; `cli` reports it as one line with exit code 130."""


def cli(main: Callable[..., int | None]) -> Callable[..., int]:
    """A CLI's `main(argv=None)` as an entry point: a PiconeoxError is one `error: ...` line and exit code 2,
    Ctrl-C is one line and exit code 130; never a traceback for a user's mistake."""

    @functools.wraps(main)
    def run(argv=None) -> int:
        try:
            return main(argv) or 0
        except Interrupted as e:
            return exit_status.finish(exit_status.INTERRUPTED, f"error: {e}")
        except PiconeoxError as e:  # under utils/launch.py the launcher prints it once, for every rank
            return exit_status.finish(exit_status.REFUSED, f"error: {e}")
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130

    return run
