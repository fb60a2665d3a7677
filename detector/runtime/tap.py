"""A second destination for what the agent sees: its events and the alerts it sends.

The agent hands each batch to an optional `EventTap` (the cluster's NATS publisher is one,
built by the command line) and goes on: a tap must return at once, whatever its own
destination does, and report what it had to drop through `take_health`, which the agent
turns into status events like its other self-health faults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from hpcsec.detector.core.schema import Event
from hpcsec.detector.engine.ruleset import RuleSet

Health = tuple[str, str, str, dict[str, Any]]  # component, action, message, extra fields


class EventTap(Protocol):
    def rules(self, ruleset: RuleSet, placeholders: dict[str, list]) -> None:
        """The rules in force (at start and after each reload)."""

    def events(self, events: list[Event]) -> None:
        """One evaluated batch of enriched events; must not block."""

    def alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """Alerts sent to the outputs; must not block."""

    def take_health(self) -> list[Health]:
        """Faults since the last call (what was dropped), as status event parts."""

    def close(self, timeout_s: float) -> int:
        """Deliver what is pending within `timeout_s`; returns how much was left (kept for
        the next start where the tap can)."""
