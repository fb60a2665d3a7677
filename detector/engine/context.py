"""What an analyst needs beside a rule's match: its description, false positives, references,
response note, and the names of the ATT&CK / ATLAS techniques and tactics its tags name.

The names come from `techniques.json`, a fixed excerpt of the public MITRE matrices shipped
with the package, so a node without Internet access shows the same names as a laptop. A tag
whose id is not in the table keeps its id with `name: null` rather than being dropped.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RESPONSE_ATTRIBUTE = "response"  # hpcsec rule attribute: triage and containment, for people
TABLE_PATH = Path(__file__).with_name("techniques.json")

_ATTACK_TECHNIQUE = re.compile(r"t\d{4}(\.\d{3})?")
_ATLAS_TECHNIQUE = re.compile(r"aml\.t\d{4}(\.\d{3})?")
_ATLAS_TACTIC = re.compile(r"aml\.ta\d{4}")


@functools.cache
def technique_table() -> dict[str, Any]:
    with TABLE_PATH.open(encoding="utf-8") as f:
        table: dict[str, Any] = json.load(f)
    return table


def _entry(ident: str, names: dict[str, str]) -> dict[str, str | None]:
    return {"id": ident, "name": names.get(ident)}


def classify_tag(tag: str) -> tuple[str, dict[str, str | None]] | None:
    """("technique" | "tactic", {id, name}) for an ATT&CK or ATLAS tag; None for other tags
    (`cve.*`, `car.*`, an ATT&CK group or software id)."""
    table = technique_table()
    namespace, _, name = str(tag).lower().partition(".")
    if namespace == "attack":
        if _ATTACK_TECHNIQUE.fullmatch(name):
            return "technique", _entry(name.upper(), table["attack_techniques"])
        tactic = table["attack_tactics"].get(name)
        if tactic is not None:
            return "tactic", {"id": tactic["id"], "name": tactic["name"]}
    elif namespace == "atlas":
        if _ATLAS_TECHNIQUE.fullmatch(name):
            return "technique", _entry(name.upper(), table["atlas_techniques"])
        if _ATLAS_TACTIC.fullmatch(name):
            return "tactic", _entry(name.upper(), table["atlas_tactics"])
    return None


def techniques_and_tactics(
    tags: Iterable[Any],
) -> tuple[list[dict[str, str | None]], list[dict[str, str | None]]]:
    """The technique and tactic entries of `tags`, each once, in the tags' order."""
    techniques: list[dict[str, str | None]] = []
    tactics: list[dict[str, str | None]] = []
    for tag in tags:
        found = classify_tag(str(tag))
        if found is None:
            continue
        kind, entry = found
        bucket = techniques if kind == "technique" else tactics
        if entry not in bucket:
            bucket.append(entry)
    return techniques, tactics


def _text_list(value: Any) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value if v is not None]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def response_note(sigma: Any) -> str | None:
    attrs = getattr(sigma, "custom_attributes", None) or {}
    value = attrs.get(RESPONSE_ATTRIBUTE)
    # prose wrapped in the YAML block: one line, so receivers and tables wrap it their way
    return _text(" ".join(value.split())) if isinstance(value, str) else None


def rule_context(sigma: Any) -> dict[str, Any]:
    """The alert fields that describe the rule rather than the match (docs/fields.md)."""
    techniques, tactics = techniques_and_tactics(getattr(sigma, "tags", None) or [])
    return {
        "rule.description": _text(getattr(sigma, "description", None)),
        "rule.falsepositives": _text_list(getattr(sigma, "falsepositives", None)),
        "rule.references": _text_list(getattr(sigma, "references", None)),
        "rule.response": response_note(sigma),
        "rule.techniques": techniques,
        "rule.tactics": tactics,
    }


def technique_label(entry: dict[str, Any]) -> str:
    """`T1496 Resource Hijacking`, or the id alone when the table does not name it."""
    return f"{entry['id']} {entry['name']}" if entry.get("name") else str(entry["id"])
