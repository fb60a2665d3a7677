"""Alerts as JSON, whatever kind of Mapping they arrive as.

orjson and json only know `dict`: given another Mapping (a read-only view, a frozen alert) they
would fall back to `str()` and send its repr instead of its fields. Every output encodes
through here so that an alert's type never changes what a receiver gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from hpcsec.detector.core.jsonenc import clean
from hpcsec.detector.outputs.protocol import Alert


def json_default(value: Any) -> Any:
    """The encoders' fallback: a Mapping is encoded as the object it is, anything else as text."""
    if isinstance(value, Mapping):
        return dict(value)
    return str(value)


def thawed(value: Any) -> Any:
    """`value` with every Mapping in it, at any depth, a new dict (the input is not changed)."""
    if isinstance(value, Mapping):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thawed(v) for v in value]
    return value


def alert_dict(alert: Alert) -> dict[str, Any]:
    """A plain dict copy of `alert`, strings made valid UTF-8 (core.jsonenc.clean), for
    formatters that work field by field."""
    plain: dict[str, Any] = clean(thawed(alert))
    return plain


def alert_bytes(alert: Alert) -> bytes:
    """`alert` as compact JSON in UTF-8 (orjson's speed for the usual, clean alert)."""
    try:
        return orjson.dumps(alert, default=json_default)
    except orjson.JSONEncodeError:
        # Strings that are not UTF-8 (file names are bytes) or integers too wide for JSON.
        return orjson.dumps(clean(thawed(alert)), default=str)
