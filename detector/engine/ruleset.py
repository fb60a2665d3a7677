"""What the rule loader hands the engine: parsed pySigma objects with their source."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sigma.correlations import SigmaCorrelationRule
from sigma.filters import SigmaFilter
from sigma.rule import SigmaRule

from hpcsec.detector.core.errors import RuleError

SigmaItem = SigmaRule | SigmaCorrelationRule | SigmaFilter


@dataclass(frozen=True)
class LoadedRule:
    """One Sigma document: a detection rule, a correlation rule or a filter."""

    sigma: SigmaItem
    path: str  # file it came from
    line: int  # line where its YAML document starts
    vector: str  # the ruleset file's stem, e.g. "rdma_abuse"
    # line of every key and list item of the document, by path (see yamlsrc.YamlDocument)
    key_lines: dict[tuple[str | int, ...], int] = field(
        default_factory=dict, compare=False, repr=False
    )
    origin: str = ""  # "bundled", or the rule path given (--rules, the config's `rules:`)

    def line_of(self, *keys: str | int) -> int:
        """Line of the deepest known node along `keys` (the document start if none)."""
        while keys:
            if keys in self.key_lines:
                return self.key_lines[keys]
            keys = keys[:-1]
        return self.line

    @property
    def id(self) -> str:
        return str(self.sigma.id) if self.sigma.id else (self.sigma.name or self.sigma.title)

    @property
    def kind(self) -> str:
        if isinstance(self.sigma, SigmaCorrelationRule):
            return "correlation"
        if isinstance(self.sigma, SigmaFilter):
            return "filter"
        return "detection"


@dataclass(frozen=True)
class EventSequence:
    """Events fed, in order, to a fresh engine; for correlation rules' tests."""

    events: tuple[dict[str, Any], ...]
    expect_match: bool
    line: int


@dataclass(frozen=True)
class RuleTest:
    """Test events a rule ships with: each `match` event must fire it, no `nomatch` may."""

    rule_id: str
    match: tuple[dict[str, Any], ...]
    nomatch: tuple[dict[str, Any], ...]
    path: str
    line: int
    match_lines: tuple[int, ...] = ()  # line of each `match` event in the tests file
    nomatch_lines: tuple[int, ...] = ()
    sequences: tuple[EventSequence, ...] = ()
    # values for the rule's `|expand` placeholders, from the tests file
    placeholders: dict[str, list[Any]] = field(default_factory=dict, compare=False)


@dataclass
class RuleSet:
    rules: list[LoadedRule] = field(default_factory=list)
    tests: list[RuleTest] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # rule files read, in order
    errors: list[RuleError] = field(default_factory=list)  # only with collect_errors=True

    def by_id(self) -> dict[str, LoadedRule]:
        return {r.id: r for r in self.rules}

    def find(self, ref: str) -> LoadedRule | None:
        """A rule by id or by `name` (correlations refer to either)."""
        for r in self.rules:
            if r.id == ref or getattr(r.sigma, "name", None) == ref:
                return r
        return None
