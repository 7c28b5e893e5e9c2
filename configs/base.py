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
