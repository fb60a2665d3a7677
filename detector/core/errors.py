"""One exception hierarchy; every error can say where it comes from (file and line)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceLocation:
    path: str | None = None
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.path or "<input>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where


class HpcsecError(Exception):
    """Base of every error the command line reports without a traceback (exit 2)."""

    def __init__(self, message: str, location: SourceLocation | None = None):
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        if self.location is None:
            return self.message
        return f"{self.location}: {self.message}"


class SourceError(HpcsecError):
    """A YAML/JSON document that cannot be read: syntax, encoding, size, aliases."""


class ConfigError(HpcsecError):
    """The site config is invalid."""


class RuleError(HpcsecError):
    """A rule file or rule is invalid."""


class UsageError(HpcsecError):
    """Wrong command-line arguments or an input that cannot be opened."""


def location(path: str | Path | None, line: int | None = None, column: int | None = None):
    return SourceLocation(str(path) if path is not None else None, line, column)
