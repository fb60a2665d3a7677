"""Events: how they are built and identified (the fields themselves are in `fields`).

Events are flat dicts with dotted field names, ECS names where ECS has one. Keeping them as
plain dicts (not objects) is deliberate: they are what JSONL, Sigma and DuckDB all speak, and
the engine reads them on its hot path.

The catalog names and the time helpers are re-exported: `schema` stays the one import for
code that builds events.
"""

from __future__ import annotations

import hashlib

import orjson

from hpcsec.detector.core.fields import (
    ALERT_COPIED_PREFIXES,
    ALERT_FIELDS,
    CATEGORIES,
    FIELD_BY_NAME,
    FIELDS,
    FILE_ACTIONS,
    FIRMWARE_COMPONENTS,
    LEVELS,
    PRODUCT,
    Field,
    is_known_field,
)
from hpcsec.detector.core.text import escape_value
from hpcsec.detector.core.timefmt import parse_time, rfc3339

__all__ = [
    "ALERT_COPIED_PREFIXES",
    "ALERT_FIELDS",
    "CATEGORIES",
    "FIELDS",
    "FIELD_BY_NAME",
    "FILE_ACTIONS",
    "FIRMWARE_COMPONENTS",
    "LEVELS",
    "PRODUCT",
    "Event",
    "Field",
    "event_id",
    "is_known_field",
    "new_event",
    "parse_time",
    "rfc3339",
    "status_event",
]

# typing.TYPE_CHECKING without importing typing (mypy reads any name TYPE_CHECKING so): the Slurm
# prolog imports this module before every job and nothing else of it needs typing at run time
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Event = dict[str, Any]
else:
    Event = dict  # what the alias is at run time: annotations are not evaluated


def event_id(fields: Event) -> str:
    """Deterministic id, so replaying a snapshot or an events file gives the same ids.

    Never raises: fields JSON cannot hold as they are (a lone surrogate from a name that is
    not UTF-8, an integer past 64 bits, hostile nesting) are hashed in their escaped form
    (core/text), the form the sensors put in events."""
    return _id_and_event(fields)[0]


def _id_and_event(fields: Event) -> tuple[str, Event]:
    """The id of `fields`, and `fields` in the form it was computed on (itself, the usual
    case, or its escaped copy)."""
    try:
        data = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS, default=str)
    except orjson.JSONEncodeError:
        fields = escape_value(fields)
        data = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.blake2b(data, digest_size=10).hexdigest(), fields


def new_event(
    category: str,
    action: str,
    sensor: str,
    host: str,
    timestamp: str,
    fields: Event | None = None,
    kind: str = "event",
) -> Event:
    """An event with the fields every event has, then `fields` (flat dotted names)."""
    event: Event = {
        "@timestamp": timestamp,
        "event.kind": kind,
        "event.category": category,
        "event.action": action,
        "host.name": host,
        "hpcsec.sensor": sensor,
    }
    if fields:
        event.update({k: v for k, v in fields.items() if v is not None})
    # A node string a sensor did not escape: the event carries the escaped form its id is
    # computed on, so no later stage meets a surrogate.
    identity, event = _id_and_event(event)
    event["event.id"] = identity
    return event


def status_event(
    sensor: str, status: str, message: str, host: str, timestamp: str, **extra: Any
) -> Event:
    """A sensor's own status record (`ok`, `unavailable`, `error`, `dropped`)."""
    return new_event(
        "sensor_status",
        status,
        sensor,
        host,
        timestamp,
        {"message": message, **extra},
        kind="state",
    )
