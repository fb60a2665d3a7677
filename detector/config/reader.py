"""Typed access to a site config document, with errors that name the file and line.

Every section parser reads through a `ConfigReader`, so a wrong type anywhere in the config
is reported the same way: `site.yml:12: assets.0.paths must be a list of strings`.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from hpcsec.detector.core.errors import ConfigError, location
from hpcsec.detector.core.timefmt import as_utc, parse_time
from hpcsec.detector.core.yamldoc import YamlDocument


def _dotted(keys: tuple[str | int, ...]) -> str:
    return ".".join(map(str, keys))


class ConfigReader:
    """One document's values, checked and converted; `fail` builds the located error."""

    def __init__(self, doc: YamlDocument):
        self.doc = doc

    def fail(self, message: str, *keys: str | int) -> ConfigError:
        return ConfigError(message, location(self.doc.path, self.doc.line_of(*keys)))

    def mapping(self, value: Any, *keys: str | int, allowed: tuple[str, ...] = ()) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(f"{_dotted(keys) or 'config'} must be a mapping", *keys)
        for k in value:
            if allowed and k not in allowed:
                raise self.fail(
                    f"unknown key {k!r} (expected one of: {', '.join(allowed)})", *keys, k
                )
        return value

    def items(self, value: Any, key: str) -> list:
        """A top-level list (`assets`, `maintenance`, `silences`); absent is empty."""
        if not value:
            return []
        if not isinstance(value, list):
            raise self.fail(f"{key} must be a list", key)
        return value

    def strings(self, value: Any, *keys: str | int) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(f"{_dotted(keys)} must be a list of strings", *keys)
        return tuple(value)

    def time(self, value: Any, *keys: str | int) -> datetime:
        """An aware UTC time. YAML reads an unquoted time as a datetime (naive without an
        offset, which is UTC here); a quoted one is RFC 3339 text."""
        if isinstance(value, datetime):
            return as_utc(value)
        try:
            return parse_time(str(value))
        except ValueError:
            raise self.fail(f"{_dotted(keys)}: not an RFC 3339 time: {value!r}", *keys) from None

    def number(
        self,
        value: Any,
        *keys: str | int,
        minimum: float | None = None,
        maximum: float | None = None,
    ) -> float | int:
        """A finite number within [minimum, maximum]. `.nan` compares false with every bound
        (a NaN threshold silently disables its rule) and `.inf` breaks every window and size
        computed from it, so neither is ever a value."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(f"{_dotted(keys)} must be a number, not {value!r}", *keys)
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(f"{_dotted(keys)} must be a finite number, not {value!r}", *keys)
        if minimum is not None and value < minimum:
            raise self.fail(f"{_dotted(keys)} must be at least {minimum:g}, not {value!r}", *keys)
        if maximum is not None and value > maximum:
            raise self.fail(f"{_dotted(keys)} must be at most {maximum:g}, not {value!r}", *keys)
        return value
