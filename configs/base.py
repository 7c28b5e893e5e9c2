"""What every config dataclass shares: dict round-trips that refuse unknown keys in one line."""
from __future__ import annotations

from dataclasses import asdict, fields

from utils.errors import PiconeoxError


class ConfigBase:
    """Mixin for the frozen config dataclasses; SECTION names them in error messages."""

    SECTION = "config"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
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
