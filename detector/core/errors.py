"""One exception hierarchy; every error can say where it comes from (file and line)."""

from __future__ import annotations

from pathlib import Path


class SourceLocation:
    """Where a document's problem is: its path (None: the input), line and column. Immutable,
    equal and hashed by value, as a frozen dataclass would be; written by hand because every
    command imports this module and `dataclasses` (with `inspect` under it) would cost a short
    one a fifth of its start-up."""

    __slots__ = ("column", "line", "path")
    path: str | None
    line: int | None
    column: int | None

    def __init__(
        self, path: str | None = None, line: int | None = None, column: int | None = None
    ) -> None:
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "line", line)
        object.__setattr__(self, "column", column)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def _key(self) -> tuple[str | None, int | None, int | None]:
        return (self.path, self.line, self.column)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"SourceLocation(path={self.path!r}, line={self.line!r}, column={self.column!r})"

    def __reduce__(self) -> tuple[type[SourceLocation], tuple[str | None, int | None, int | None]]:
        return (SourceLocation, self._key())  # pickle and copy without the refused setattr

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
