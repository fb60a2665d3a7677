"""An alert as an Elastic Common Schema (ECS) document, for the Elasticsearch output.

Event fields are renamed by the ECS table that `rules convert` uses (engine/fieldmaps.py), so a
converted rule and an alert document spell a field the same way; the alert's own fields go to
ECS's `event.*`, `rule.*`, `message` and `tags`, and what ECS has no place for to `hpcsec.*`.
Keys stay dotted: Elasticsearch expands them into objects.
"""

from __future__ import annotations

from typing import Any

from hpcsec.detector.engine.fieldmaps import ECS
from hpcsec.detector.outputs.alertjson import alert_dict
from hpcsec.detector.outputs.protocol import Alert

# ECS event.severity is a number; ours from the rule level.
SEVERITY = {"informational": 1, "low": 21, "medium": 47, "high": 73, "critical": 99}
ALERT_FIELDS = {
    "rule.title": "rule.name",
    "rule.vector": "rule.ruleset",
    "rule.tags": "tags",
    "rule.description": "rule.description",
    "alert.summary": "message",
    "alert.first_seen": "event.start",
    "alert.last_seen": "event.end",
    "events": "hpcsec.events",
    "count": "hpcsec.alert.count",
}


def _ecs_name(name: str) -> str:
    if name in ALERT_FIELDS:
        return ALERT_FIELDS[name]
    if name.startswith(("alert.", "rule.")) and name not in ("rule.id",):
        return "hpcsec." + name
    return ECS.field(name)


def ecs_document(alert: Alert) -> dict[str, Any]:
    """The ECS document of `alert` (a new dict; the alert is not changed)."""
    plain = alert_dict(alert)
    doc: dict[str, Any] = {
        "event.kind": "alert",
        "event.module": "hpcsec",
        "event.dataset": "hpcsec.alert",
        "event.id": plain.get("alert.id", ""),
    }
    level = str(plain.get("rule.level", ""))
    if level in SEVERITY:
        doc["event.severity"] = SEVERITY[level]
    if "rule.references" in plain:
        doc["rule.reference"] = " ".join(map(str, plain.pop("rule.references") or []))
    for name, value in plain.items():
        doc[_ecs_name(name)] = value
    return doc
