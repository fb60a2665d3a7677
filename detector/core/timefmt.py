"""Event times: the one place that formats and parses them.

Events carry `@timestamp` as RFC 3339 text in UTC with millisecond precision. Node data is
hostile input, so every reader goes through `parse_time` (or the helpers built on it) and
gets the same answer for the same text: a correlation window, a dedup key, a maintenance
window and the alert store must never disagree about when something happened.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime | None = None) -> str:
    """UTC time (now when not given) as RFC 3339, microseconds trimmed to milliseconds.
    A naive `moment` is read as UTC, never as the local time of the machine."""
    moment = as_utc(moment or datetime.now(UTC))
    return year_first(moment, "T") + f".{moment.microsecond // 1000:03d}Z"


def year_first(moment: datetime, between: str = " ") -> str:
    """`YYYY-MM-DD<between>HH:MM:SS` with four year digits whatever the year: glibc's
    strftime writes year 1 as `1`, text no RFC 3339 reader (ours included) takes back."""
    return (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}{between}"
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    )


def parse_time(value: str) -> datetime:
    """RFC 3339 (with `Z`, `z` or an offset) to an aware UTC datetime; ValueError if not one.

    What `datetime.fromisoformat` reads is accepted (surrounding whitespace too); text
    without an offset is UTC.
    """
    if not isinstance(value, str):  # e.g. an events file with "@timestamp": 1733000000
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    moment = datetime.fromisoformat(text)
    try:
        return as_utc(moment)
    except OverflowError:  # year 1 at +01:00, year 9999 at -01:00: no UTC time in range
        raise ValueError(f"not a time in range once made UTC: {value[:40]!r}") from None


def is_event_time(text: str) -> bool:
    """`text` is a full date and time `parse_time` reads, not just a date or a week.

    Correlation windows and dedup run on event time: a time that does not parse would land
    the event in the epoch's window, so such an event is malformed rather than misplaced.
    """
    if len(text) < 19 or text[4] != "-" or text[10] not in "Tt ":
        return False
    if len(text) == 24 and text[23] == "Z" and text[19] == "." and text.isascii():
        # The form every sensor writes (`rfc3339`): Python 3.11+ `fromisoformat` reads its
        # `Z` as UTC itself, without the strip and `+00:00` rewrite of `parse_time`; text it
        # refuses still goes the long way below.
        try:
            datetime.fromisoformat(text)
            return True
        except ValueError:
            pass
    try:
        parse_time(text)
    except ValueError:
        return False
    return True


def epoch_seconds(value: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 text; None when `value` is not one."""
    if not isinstance(value, str):
        return None
    try:
        return parse_time(value).timestamp()
    except ValueError:
        return None


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime: a naive one (e.g. YAML's unquoted time) is read as UTC."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)
