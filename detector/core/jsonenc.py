"""JSON for alerts that carry whatever the node handed us.

File names are bytes on Linux: Python decodes a name that is not UTF-8 with lone surrogates
(`surrogateescape`), which neither orjson nor a strict JSON parser accepts. An attacker who
names a file `\\xff.bin` must not make the alert about it undeliverable, so such strings are
written with the offending bytes as visible `\\xNN` escapes (what an analyst needs to find the
file), and integers too wide for JSON parsers become strings.
"""

from __future__ import annotations

from typing import Any

import orjson

_INT_MAX = 2**63 - 1


def clean_text(text: str) -> str:
    """`text` as valid UTF-8: an undecodable byte becomes the four characters `\\xNN`."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")  # the original bytes
    except UnicodeEncodeError:  # a surrogate that did not come from a byte
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def clean(value: Any) -> Any:
    """`value` with every string made valid UTF-8 and every oversized integer a string."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _INT_MAX:
        return str(value)
    return value


def dumps(value: Any, option: int | None = None) -> bytes:
    """orjson's output, or, when orjson refuses the value, the output for `clean(value)`."""
    try:
        return orjson.dumps(value, default=str, option=option)
    except orjson.JSONEncodeError:
        return orjson.dumps(clean(value), default=str, option=option)
