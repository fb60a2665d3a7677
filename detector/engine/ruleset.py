"""What the rule loader hands the engine: rules with their source, each a light header
(what listing, routing and correlation references need) and its pySigma object.

A rule read from the rule cache (rulecache.py) carries its pySigma object as pickled bytes,
unpickled the first time `.sigma` is read: a cached load reads headers only, and a command
that lists rules or checks a config never imports pySigma's parser. This module therefore
imports nothing of pySigma at run time; headers are computed by header.py.
"""

from __future__ import annotations

import pickle
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.core.record import FrozenRecord, Record

if TYPE_CHECKING:
    from sigma.correlations import SigmaCorrelationRule
    from sigma.filters import SigmaFilter
    from sigma.rule import SigmaRule

    SigmaItem = SigmaRule | SigmaCorrelationRule | SigmaFilter
else:
    SigmaItem = Any

KeyLines = dict[tuple[str | int, ...], int]
BUNDLED = "bundled"  # the origin of the rules shipped with hpcsec


# What is known of a rule without its pySigma object (all plain values). The functional form:
# a class body's annotations are strings here (`from __future__ import annotations`), and
# typing compiles each to check it, the first compile building Python's AST types, a
# twentieth of a cached `rules list`.
RuleHeader = NamedTuple(  # noqa: UP014 (see above)
    "RuleHeader",
    [
        ("id", str),  # the Sigma id, else its name, else its title
        ("name", str | None),  # the Sigma `name` (correlations refer to a rule by id or name)
        ("sigma_id", str),  # the Sigma id as written, "" when none
        ("title", str),
        ("kind", str),  # "detection", "correlation" or "filter"
        ("product", str | None),  # logsource
        ("category", str | None),
        ("service", str | None),
        ("level", str),  # "" when none
        ("status", str),
        ("tags", tuple[str, ...]),
        ("description", str | None),
        ("falsepositives", tuple[str, ...]),
        ("references", tuple[str, ...]),
        ("custom_attributes", dict[str, Any]),  # the `response` note and `thresholds` names only
        # placeholder name -> fields it is tested against (detection rules)
        ("placeholder_fields", dict[str, tuple[str, ...]]),
        # it tests a command-line field or has keywords (header.reads_command_line)
        ("reads_command_line", bool),
    ],
)


_LOADING = threading.Lock()  # one unpickling of a rule at a time: every reader sees one object


class LoadedRule:
    """One Sigma document: a detection rule, a correlation rule or a filter.

    Made from its pySigma object (`LoadedRule(sigma, path, line, vector)`), or from the rule
    cache with a header and the pickled `(sigma, key_lines)` (`LoadedRule.cached`)."""

    __slots__ = ("_blob", "_header", "_key_lines", "_sigma", "line", "origin", "path", "vector")

    def __init__(
        self,
        sigma: SigmaItem,
        path: str,  # file it came from
        line: int,  # line where its YAML document starts
        vector: str,  # the ruleset file's stem, e.g. "rdma_abuse"
        # line of every key and list item of the document, by path (yamlsrc.YamlDocument)
        key_lines: KeyLines | None = None,
        origin: str = "",  # "bundled", or the rule path given (--rules, the config's `rules:`)
    ):
        self._sigma: SigmaItem | None = sigma
        self._key_lines: KeyLines | None = {} if key_lines is None else key_lines
        self._header: RuleHeader | None = None
        self._blob: bytes | None = None
        self.path, self.line, self.vector, self.origin = path, line, vector, origin

    @classmethod
    def cached(
        cls, header: RuleHeader, blob: bytes, path: str, line: int, vector: str, origin: str
    ) -> LoadedRule:
        """A rule from the cache: `blob` is the pickled (sigma, key_lines), read on demand."""
        rule = cls.__new__(cls)
        rule._sigma, rule._key_lines, rule._header, rule._blob = None, None, header, blob
        rule.path, rule.line, rule.vector, rule.origin = path, line, vector, origin
        return rule

    # -- the pySigma object and the key lines, unpickled on first use -------------------------
    def _load(self) -> tuple[SigmaItem, KeyLines]:
        with _LOADING:
            if self._sigma is None or self._key_lines is None:
                try:
                    self._sigma, self._key_lines = pickle.loads(self._blob or b"")
                except Exception as e:  # an entry damaged after its checksum was verified
                    raise RuleError(
                        f"rule {self.id}: its rule cache entry cannot be read "
                        f"({type(e).__name__}); remove the cache directory to rebuild it",
                        location(self.path, self.line),
                    ) from e
            return self._sigma, self._key_lines

    @property
    def sigma(self) -> SigmaItem:
        sigma = self._sigma
        return sigma if sigma is not None else self._load()[0]

    @property
    def sigma_loaded(self) -> bool:
        """Whether the pySigma object is in memory (a cached rule's is read on first use)."""
        return self._sigma is not None

    @property
    def key_lines(self) -> KeyLines:
        key_lines = self._key_lines
        return key_lines if key_lines is not None else self._load()[1]

    def release(self) -> None:
        """Drop a cached rule's pySigma object once it is compiled: it is read again from its
        bytes if something needs it (an alert's title, say). A parsed rule keeps its own."""
        with _LOADING:
            if self._blob is not None:
                self._sigma = self._key_lines = None

    def blob(self) -> bytes:
        """The pickled (sigma, key_lines), what the rule cache stores."""
        if self._blob is not None:
            return self._blob
        return pickle.dumps((self.sigma, self.key_lines), protocol=pickle.HIGHEST_PROTOCOL)

    @property
    def header(self) -> RuleHeader:
        if self._header is None:
            # pySigma is imported already when a rule was made from its object; the import
            # stays out of this module so that a cached load does not pay for it
            from hpcsec.detector.engine.header import header_of

            self._header = header_of(self.sigma)
        return self._header

    def line_of(self, *keys: str | int) -> int:
        """Line of the deepest known node along `keys` (the document start if none)."""
        key_lines = self.key_lines
        while keys:
            if keys in key_lines:
                return key_lines[keys]
            keys = keys[:-1]
        return self.line

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def name(self) -> str | None:
        return self.header.name

    @property
    def title(self) -> str:
        return self.header.title

    @property
    def kind(self) -> str:
        return self.header.kind

    def rerouted(self, product: str, category: str) -> LoadedRule:
        """This rule with another logsource product and category (bench and tests route rule
        sets of other products to categories of their own); its pySigma object is shared."""
        header = self.header._replace(product=product, category=category)
        if self._sigma is None:
            return LoadedRule.cached(
                header, self._blob or b"", self.path, self.line, self.vector, self.origin
            )
        rule = LoadedRule(self._sigma, self.path, self.line, self.vector, self._key_lines)
        rule.origin, rule._header = self.origin, header
        return rule

    def _identity(self) -> tuple[Any, ...]:
        return (self.path, self.line, self.vector, self.origin, self.header, self.sigma)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LoadedRule):
            return NotImplemented
        return self is other or self._identity() == other._identity()

    __hash__ = None  # type: ignore[assignment]  # like the dataclass it was: compared, not hashed

    def __repr__(self) -> str:
        return f"LoadedRule(id={self.id!r}, path={self.path!r}, line={self.line})"

    def __reduce__(self) -> tuple[Any, ...]:
        if self._blob is not None:  # a cached rule travels as it came: header and bytes
            header = tuple(self.header)
            return _cached_rule, (
                header,
                self._blob,
                self.path,
                self.line,
                self.vector,
                self.origin,
            )
        return (
            LoadedRule,
            (self.sigma, self.path, self.line, self.vector, self.key_lines, self.origin),
        )


def _cached_rule(
    header: tuple[Any, ...], blob: bytes, path: str, line: int, vector: str, origin: str
) -> LoadedRule:
    return LoadedRule.cached(RuleHeader(*header), blob, path, line, vector, origin)


# Not dataclasses (core/record.py): `rules list` and `config check` import this module.
class EventSequence(FrozenRecord):
    """Events fed, in order, to a fresh engine; for correlation rules' tests."""

    __slots__ = ("events", "expect_match", "line")
    events: tuple[dict[str, Any], ...]
    expect_match: bool
    line: int

    def __init__(self, events: tuple[dict[str, Any], ...], expect_match: bool, line: int):
        self._set(events=events, expect_match=expect_match, line=line)


class RuleTest(FrozenRecord):
    """Test events a rule ships with: each `match` event must fire it, no `nomatch` may."""

    __slots__ = (  # noqa: RUF023 (the fields' order: the constructor's and the repr's)
        "rule_id",
        "match",
        "nomatch",
        "path",
        "line",
        "match_lines",
        "nomatch_lines",
        "sequences",
        "placeholders",
    )
    _not_compared = frozenset({"placeholders"})
    rule_id: str
    match: tuple[dict[str, Any], ...]
    nomatch: tuple[dict[str, Any], ...]
    path: str
    line: int
    match_lines: tuple[int, ...]  # line of each `match` event in the tests file
    nomatch_lines: tuple[int, ...]
    sequences: tuple[EventSequence, ...]
    # values for the rule's `|expand` placeholders, from the tests file
    placeholders: dict[str, list[Any]]

    def __init__(
        self,
        rule_id: str,
        match: tuple[dict[str, Any], ...],
        nomatch: tuple[dict[str, Any], ...],
        path: str,
        line: int,
        match_lines: tuple[int, ...] = (),
        nomatch_lines: tuple[int, ...] = (),
        sequences: tuple[EventSequence, ...] = (),
        placeholders: dict[str, list[Any]] | None = None,
    ):
        self._set(
            rule_id=rule_id,
            match=match,
            nomatch=nomatch,
            path=path,
            line=line,
            match_lines=match_lines,
            nomatch_lines=nomatch_lines,
            sequences=sequences,
            placeholders={} if placeholders is None else placeholders,
        )


class RuleSet(Record):
    __slots__ = ("rules", "tests", "files", "errors")  # noqa: RUF023 (the fields' order)
    rules: list[LoadedRule]
    tests: list[RuleTest]
    files: list[str]  # rule files read, in order
    errors: list[RuleError]  # only with collect_errors=True

    def __init__(
        self,
        rules: list[LoadedRule] | None = None,
        tests: list[RuleTest] | None = None,
        files: list[str] | None = None,
        errors: list[RuleError] | None = None,
    ):
        self.rules = [] if rules is None else rules
        self.tests = [] if tests is None else tests
        self.files = [] if files is None else files
        self.errors = [] if errors is None else errors

    def by_id(self) -> dict[str, LoadedRule]:
        return {r.id: r for r in self.rules}

    def find(self, ref: str) -> LoadedRule | None:
        """A rule by id or by `name` (correlations refer to either)."""
        for r in self.rules:
            if r.id == ref or r.name == ref:
                return r
        return None
