"""The identity of a detection alert: which matches are repeats of one action, and which are
distinct actions that each deserve an alert of their own (docs/outputs.md, "Dedup").

Folding every match of a rule by one host, job and user into the window's first alert would
let an adversary choose what the outputs show: read a harmless file first, and the three
weight shards copied next only grow its count. The identity therefore adds to (host, job,
user) the values that make an action distinct: the process, the file or device it touched,
the peer it talked to. Matches with the same identity fold into one alert with a
`count`; a new identity is a new alert with its own `alert.id`, visible to every output.

A rule names its own identity with the `alert_identity:` attribute (a list of event fields;
an empty list folds on host, job and user alone). Correlations keep their `group-by`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Always part of the identity: the node, job and user an analyst acts on.
DEFAULT_KEY_FIELDS = ("host.name", "slurm.job.id", "user.name")

# What makes an action distinct by default. Each entry is one facet: the first of its fields
# that the event carries gives the value (a process is its pid and its executable, or its
# name where the executable could not be read). `hpcsec.sensor` tells apart the components a
# self-health alert is about (rules/self_health.yml); for other events it follows the category.
DEFAULT_IDENTITY: tuple[tuple[str, ...], ...] = (
    ("process.pid",),
    ("process.executable", "process.name"),
    ("file.path",),
    ("destination.ip",),
    ("destination.port",),
    ("firmware.device",),
    ("hpcsec.sensor",),
)

ATTRIBUTE = "alert_identity"

# Distinct identities per rule, (host, job, user) and window before further ones fold into one
# overflow alert: the builder's memory stays bounded whatever a node's user does (a loop over
# a million file names), and the overflow alert says that more actions were folded into it.
MAX_DISTINCT_PER_KEY = 100
# ...and per rule, host and window, whatever the job and user: a compromised node writes the
# job and user of its events itself (the hub takes only `host.name` from where it published,
# docs/cluster.md), so a million made-up users must not make a million alerts, nor a
# million open ones in the hub's memory. A node runs a few jobs at a time: 10 of them each at
# the per-key cap still fit.
MAX_DISTINCT_PER_HOST = 1000
OVERFLOW_FIELD = "alert.distinct_overflow"

Facets = tuple[tuple[str, ...], ...]


def declared_identity(custom_attributes: Mapping[str, Any] | None) -> Facets | None:
    """The rule's own identity fields, or None when it declares none or a malformed value
    (not a list of field names): the default identity applies then."""
    raw = (custom_attributes or {}).get(ATTRIBUTE)
    if not isinstance(raw, list) or not all(isinstance(f, str) and f for f in raw):
        return None
    return tuple((f,) for f in raw)


def rule_identity(sigma: Any) -> Facets:
    """The facets of a rule's identity: its `alert_identity:`, else the default."""
    declared = declared_identity(getattr(sigma, "custom_attributes", None))
    return DEFAULT_IDENTITY if declared is None else declared


def base_key(event: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, event.get(k)) for k in DEFAULT_KEY_FIELDS)


def identity_values(event: Mapping[str, Any], facets: Facets) -> tuple[tuple[str, Any], ...]:
    """(field, value) of each facet: the first of its fields the event has, else (first, None)."""
    values = []
    for fields in facets:
        found = next(((f, event[f]) for f in fields if event.get(f) is not None), None)
        values.append(found if found is not None else (fields[0], None))
    return tuple(values)


def overflow_key(base: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """The key of the alert that further distinct actions of `base` fold into: (host, job,
    user) past MAX_DISTINCT_PER_KEY, the host alone past MAX_DISTINCT_PER_HOST."""
    return (*base, (OVERFLOW_FIELD, True))


def host_of(base: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """The host part of a `base_key`."""
    return base[:1]
