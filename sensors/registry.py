"""The explicit list of sensors, by name. Add a sensor here; nothing registers on import."""

from __future__ import annotations

from .base import SensorSpec

# Filled in as sensors land; each entry points at the module that implements the source.
SENSORS: tuple[SensorSpec, ...] = ()


def by_name() -> dict[str, SensorSpec]:
    return {spec.name: spec for spec in SENSORS}


def select(names: list[str] | None) -> list[SensorSpec]:
    """The named sensors (KeyError with the unknown name), or the default-enabled ones."""
    table = by_name()
    if not names:
        return [s for s in SENSORS if s.default_enabled]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise KeyError(", ".join(unknown))
    return [table[n] for n in names]
