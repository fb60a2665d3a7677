"""Rules as dicts and their parsed conditions, for the literal index's tests."""

from __future__ import annotations

from typing import Any

from sigma.collection import SigmaCollection
from sigma.rule import SigmaRule


def rule(n: int, detection: dict[str, Any]) -> dict[str, Any]:
    """A process rule numbered `n` (its id) with `detection`."""
    return {
        "title": f"index {n}",
        "id": f"00000000-0000-4000-8000-{n:012d}",
        "logsource": {"product": "hpc", "category": "process"},
        "detection": detection,
    }


def condition_of(detection: dict[str, Any]) -> Any:
    """The parsed condition tree of a rule with `detection`."""
    sigma = SigmaCollection.from_dicts([rule(0, detection)]).rules[0]
    assert isinstance(sigma, SigmaRule)
    return sigma.detection.parsed_condition[0].parse()
