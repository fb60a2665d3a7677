"""Reading events from JSONL: malformed lines are skipped, counted and reported, never fatal."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

import orjson

from .schema import Event

MAX_REPORTED_LINES = 5


@dataclass
class InputReport:
    """What was wrong with an input: counts and the first few line numbers."""

    source: str
    lines: int = 0
    events: int = 0
    malformed: int = 0
    malformed_lines: list[tuple[int, str]] = field(default_factory=list)

    def reject(self, line_no: int, why: str) -> None:
        self.malformed += 1
        if len(self.malformed_lines) < MAX_REPORTED_LINES:
            self.malformed_lines.append((line_no, why))

    def describe(self) -> str | None:
        if not self.malformed:
            return None
        first = "; ".join(f"line {n}: {why}" for n, why in self.malformed_lines)
        more = "" if self.malformed <= len(self.malformed_lines) else ", …"
        return (f"{self.source}: skipped {self.malformed} malformed line(s) of {self.lines} "
                f"({first}{more})")


def read_jsonl(stream: BinaryIO | Iterable[bytes], report: InputReport) -> Iterator[Event]:
    """Events from JSONL lines; blank lines are ignored, anything else must be an object."""
    for line_no, raw in enumerate(stream, 1):
        report.lines = line_no
        if not raw.strip():
            continue
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            report.reject(line_no, f"not JSON ({exc.args[0].split(':')[0]})")
            continue
        if not isinstance(value, dict):
            report.reject(line_no, f"not an object but {type(value).__name__}")
            continue
        report.events += 1
        yield value
