"""The project's user-error class.

Raise PiconeoxError for anything the user can fix (bad flag, bad file, mismatched data). CLI scripts
catch it, print `error: <message>` to stderr and exit 2, so the message must be one clear line naming
the bad value and what is allowed. Never put credentials in the message.
"""


class PiconeoxError(Exception):
    """A user-fixable problem, reported as one line without a traceback."""
