"""Hang bounds: how long a test waits for an event (an exit, a file, a line, a thread) before it calls the wait a hang.

A bound is never a timing assertion: the test waits for the event, and the bound only turns a hang into a failure
that names what did not come, instead of a suite that stalls. Every bound is written as `bound(seconds)`, where
`seconds` is a generous wait on a quiet box, and scaled here by one load factor for the box the suite runs on:

    PICONEOX_TEST_LOAD_FACTOR=4 .venv/bin/python -m pytest -q   # a box shared with other work: every bound x4

The default, 2, is for a busy 2-core CI box: the whole suite took 418-424 s there idle and 818-899 s with both cores
loaded by `yes` (docs/development.md), so what is generous on the quiet box is doubled. A lower factor (1) finds a
hang sooner on a fast idle machine; a higher one keeps a slower or shared machine from calling slowness a hang.
"""
from __future__ import annotations

import math
import os

LOAD_FACTOR_VARIABLE = "PICONEOX_TEST_LOAD_FACTOR"
DEFAULT_LOAD_FACTOR = 2.0


def load_factor() -> float:
    """The factor from PICONEOX_TEST_LOAD_FACTOR (a positive number), DEFAULT_LOAD_FACTOR when it is unset or empty."""
    text = os.environ.get(LOAD_FACTOR_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LOAD_FACTOR
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"{LOAD_FACTOR_VARIABLE}={text!r}: must be a positive number (unset: {DEFAULT_LOAD_FACTOR:g},"
                         " for a busy 2-core box)")
    return factor


def bound(seconds: float) -> float:
    """The hang bound for a wait that takes at most `seconds` on a quiet box: `seconds` x the load factor."""
    return seconds * load_factor()
