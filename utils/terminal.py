"""Text from users and models is shown, never obeyed, by the terminal: control characters are escaped."""
from __future__ import annotations

import re

# C0 and C1 controls and DEL, but not newline and tab (they are layout): ESC sequences could move the cursor,
# clear the screen or retitle the window when a prompt or a sampled byte is echoed raw.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character except newline and tab written as a Python escape (\\x1b)."""
    return CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
