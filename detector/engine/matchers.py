"""Value tests the generated rule code calls for everything but the common string shapes.

Each factory returns a function of one event value. Event values are JSON values: strings,
numbers, booleans, lists (e.g. `slurm.job.gpus: [0, 1]`: any element may match) and null.
"""

from __future__ import annotations

import ipaddress
import operator
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from hpcsec.detector.core.schema import parse_time
from hpcsec.detector.engine.regex import Searcher, finds

Test = Callable[[Any], bool]


def as_text(value: Any) -> str | None:
    """The string a Sigma string value is compared with: numbers by their JSON spelling,
    booleans as `true`/`false`; objects never match a string."""
    cls = value.__class__
    if cls is str:
        return value
    if cls is bool:
        return "true" if value else "false"
    if cls is int or cls is float:
        return str(value)
    return None


def as_number(value: Any) -> int | float | None:
    """Numeric rule values match numbers and numeric strings, never booleans."""
    cls = value.__class__
    if cls is int or cls is float:
        return value
    if cls is str:
        try:
            return float(value)
        except ValueError:
            return None
    return None


def lift(test: Test) -> Test:
    """Extend a scalar test to the event value as found: absent/None never matches, a list
    matches when one of its elements does."""

    def lifted(value: Any) -> bool:
        if value is None:
            return False
        if value.__class__ is list:
            return any(x is not None and test(x) for x in value)
        return test(value)

    return lifted


def on_text(test: Callable[[str], bool], fold: bool) -> Test:
    def text_test(value: Any) -> bool:
        text = as_text(value)
        if text is None:
            return False
        return test(text.lower() if fold else text)

    return text_test


def number_equals(number: int | float) -> Test:
    def equals(value: Any) -> bool:
        found = as_number(value)
        return found is not None and found == number

    return equals


def bool_equals(expected: bool) -> Test:
    spelled = "true" if expected else "false"

    def equals(value: Any) -> bool:
        if value.__class__ is bool:
            return value is expected
        return value.__class__ is str and value.lower() == spelled

    return equals


def regex(pattern: Searcher) -> Test:
    """Sigma regexes are unanchored (search), case-sensitive unless the `i` flag is set."""
    found = finds(pattern)

    def search(value: Any) -> bool:
        text = as_text(value)
        return text is not None and found(text)

    return search


@lru_cache(maxsize=65536)
def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def cidr(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> Test:
    """Membership by address arithmetic (any prefix length), not by string patterns."""
    version = network.version
    base = int(network.network_address)
    mask = int(network.netmask)

    def contains(value: Any) -> bool:
        if value.__class__ is not str:
            return False
        address = parse_ip(value)
        if address is None:
            return False
        if address.version != version:
            mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:a.b.c.d in an IPv4 net
            if mapped is None or version != 4:
                return False
            address = mapped
        return (int(address) & mask) == base

    return contains


COMPARISONS = {
    "LT": operator.lt,
    "LTE": operator.le,
    "GT": operator.gt,
    "GTE": operator.ge,
    "NEQ": operator.ne,
}


def compare(op: str, number: int | float) -> Test:
    relation = COMPARISONS[op]

    def compares(value: Any) -> bool:
        found = as_number(value)
        return found is not None and relation(found, number)

    return compares


def _moment(value: Any) -> datetime | None:
    cls = value.__class__
    try:
        if cls is str:
            return parse_time(value)
        if cls is int or cls is float:
            return datetime.fromtimestamp(value, UTC)
    except (ValueError, OverflowError, OSError):
        return None
    return None


TIME_PARTS: dict[str, Callable[[datetime], int]] = {
    "minute": lambda t: t.minute,
    "hour": lambda t: t.hour,
    "day": lambda t: t.day,
    "week": lambda t: t.isocalendar()[1],  # ISO 8601 week number
    "month": lambda t: t.month,
    "year": lambda t: t.year,
}


def time_part(part: str, number: int | float, op: str = "EQ") -> Test:
    """`|hour: 3`, `|hour|gte: 20` etc.: the field read as a time (RFC 3339 or epoch seconds,
    UTC), the part compared with the number."""
    extract = TIME_PARTS[part]
    relation = COMPARISONS.get(op, operator.eq)

    def compares(value: Any) -> bool:
        moment = _moment(value)
        return moment is not None and relation(extract(moment), number)

    return compares


def fieldref(starts_with: bool, ends_with: bool) -> Callable[[Any, Any], bool]:
    """`a|fieldref: b`: the value of field a equals (or starts/ends with, or contains) the
    value of field b, case-insensitively; absent fields never match."""

    def refers(value: Any, other: Any) -> bool:
        if value is None or other is None:
            return False
        left, right = as_text(value), as_text(other)
        if left is None or right is None:
            return False
        left, right = left.lower(), right.lower()
        if starts_with and ends_with:
            return right in left
        if starts_with:
            return left.startswith(right)
        if ends_with:
            return left.endswith(right)
        return left == right

    return refers


# What keywords do not search: what hpcsec adds to an observation rather than observed. The
# `hpcsec.*` namespace (asset names, maintenance, the sensor), the event's own hash, the
# decisions enrichment takes from policy and other events (detector/enrich/), and the Slurm
# job context it adds to other categories' events (a `slurm_job` event observed it itself).
NOT_SEARCHED = frozenset(
    {
        "event.id",
        "user.is_admin",
        "process.is_gpu_service",
        "destination.is_job_node",
        "gpu.allocated_to_job",
        "firmware.baseline_version",
        "firmware.drift",
        "firmware.known_vulnerable",
    }
)


def searched_by_keywords(name: str, category: Any) -> bool:
    if name in NOT_SEARCHED or name.startswith("hpcsec."):
        return False
    return category == "slurm_job" or not name.startswith("slurm.")


def keyword(test: Test) -> Callable[[dict[str, Any]], bool]:
    """A field-less detection value searches every string (and list element) of the event's
    observed fields (not those hpcsec adds: see NOT_SEARCHED)."""

    def search(event: dict[str, Any]) -> bool:
        category = event.get("event.category")
        for name, value in event.items():
            if value is None or value.__class__ is dict:
                continue
            if not searched_by_keywords(name, category):
                continue
            if value.__class__ is list:
                if any(x is not None and test(x) for x in value):
                    return True
            elif test(value):
                return True
        return False

    return search
