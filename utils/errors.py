"""The project's user-error class.

Raise PiconeoxError for anything the user can fix (bad flag, bad file, mismatched data). CLI scripts
catch it, print `error: <message>` to stderr and exit 2, so the message must be one clear line naming
the bad value and what is allowed. Never put credentials in the message. The CLIs parse their flags
with CliParser, so a flag mistake is that same one line too (argparse would print its whole usage first).
"""
import argparse


class PiconeoxError(Exception):
    """A user-fixable problem, reported as one line without a traceback."""


class CliParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line `error: ...` and exit 2, like every other user mistake."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
