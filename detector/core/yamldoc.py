"""A YAML document's value and the line of each of its parts (built by core/yamlsrc.py).

Kept apart from the parser so that what reads a document already parsed (the site config
cache, config/doccache.py) does not import PyYAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Path_ = tuple[str | int, ...]


@dataclass
class YamlDocument:
    """One document of a YAML stream: its value and where each part of it stands."""

    data: Any
    path: str
    line: int
    lines: dict[Path_, int] = field(default_factory=dict)

    def line_of(self, *keys: str | int) -> int:
        """Line of the deepest known node along `keys` (the document start if none)."""
        while keys:
            if keys in self.lines:
                return self.lines[keys]
            keys = keys[:-1]
        return self.line
