"""What every config dataclass shares: dict round-trips that refuse unknown keys in one line."""
from __future__ import annotations

import math
from dataclasses import asdict, fields
from typing import Callable

from utils.errors import PiconeoxError


class ConfigBase:
    """Mixin for the frozen config dataclasses; SECTION names them in error messages."""

    SECTION = "config"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in set(d) - known)
        if unknown:
            raise PiconeoxError(f"unknown {cls.SECTION} setting {unknown[0]!r}; allowed: {', '.join(sorted(known))}")
        return cls(**d)

    def check_ints(self, names: tuple[str, ...], minimum: int) -> None:
        """Each named field must be an int (not a bool) >= minimum, or one PiconeoxError line names it."""
        rule = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise PiconeoxError(f"{self.SECTION}.{name}={value!r}: must be {rule}")

    def check_float(self, name: str, ok: Callable[[float], bool], rule: str) -> None:
        """The named field must be a finite number (not a bool) with ok(value), or one PiconeoxError line says
        `rule`."""
        value = getattr(self, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
            raise PiconeoxError(f"{self.SECTION}.{name}={value!r}: must be {rule}")
