"""The rule evaluation engine: events in, matches out.

    engine = Engine(ruleset, placeholders={"admins": ["adm-carol"]})
    matches = engine.evaluate(events)   # stateful across calls (correlation windows)
    matches += engine.flush()           # end of input

Routing: a detection rule only sees events whose `event.category` is its logsource category
(`product: hpc`); rules are compiled per category (see compile.py) so an event runs only its
category's rules. Sigma filters are AND-ed into the rules they name (their condition is written
the Sigma way, e.g. `not selection`). Correlations (correlate.py) are fed by the rules they
reference; a referenced rule alerts on its own only when the correlation says `generate: true`.

Value semantics (tests/detector/test_engine_semantics.py has one test each):
- strings match case-insensitively unless `|cased`; `*` and `?` are wildcards, `\\` escapes;
  regexes (`|re`) search unanchored and are case-sensitive unless `|i`;
- a field absent from the event (or null) matches nothing but `null` and `|exists: false`;
  `|exists: true` needs a non-null value;
- numeric rule values match numbers and numeric strings (never booleans); strings match numbers
  by their JSON spelling; booleans match booleans and the strings `true`/`false`;
- a list in the event (e.g. `slurm.job.gpus`) matches when one of its elements does;
- `|cidr` compares addresses (IPv4, IPv6, any prefix; `::ffff:a.b.c.d` counts as IPv4);
- `|fieldref` compares two fields case-insensitively; time parts read RFC 3339 strings or
  epoch seconds in UTC, `|week` being the ISO 8601 week;
- keywords (values without a field) search the event's observed values for a substring, not
  the fields hpcsec adds (matchers.NOT_SEARCHED);
- a `|expand` placeholder without a value matches nothing, with a warning (prepare.py).
Correlations see their events in event-time order, whatever the arrival order (reorder.py).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sigma.conditions import ConditionOR
from sigma.correlations import SigmaCorrelationRule
from sigma.exceptions import SigmaError

from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.schema import PRODUCT
from hpcsec.detector.engine.cmdline_literals import command_line_literals
from hpcsec.detector.engine.compile import Predicate
from hpcsec.detector.engine.correlate import Correlation, check_chains
from hpcsec.detector.engine.correlation_rules import referenced_rules
from hpcsec.detector.engine.groups import EngineStats, Fired, epoch, timestamp_text
from hpcsec.detector.engine.index import INDEX_MIN_RULES, CategoryBuilder, category_weight
from hpcsec.detector.engine.memory import return_freed_memory, young_collected
from hpcsec.detector.engine.prepare import (
    fill_placeholders,
    filter_applies,
    filter_condition,
    rule_error,
)
from hpcsec.detector.engine.reorder import Clock, ReorderBuffer
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet
from hpcsec.detector.engine.values import UnsupportedValue

logger = get_logger(__name__)
# The compile errors this process logged: each once, whichever of its engines met it (a scan
# builds a category in its own engines and in its workers', which send theirs to it).
_LOGGED_ERRORS: set[str] = set()
MAX_LOGGED_ERRORS = 10_000


def log_compile_error(message: str) -> None:
    """Log a lazy engine's compile error, unless this process logged it already."""
    if message in _LOGGED_ERRORS:
        return
    if len(_LOGGED_ERRORS) < MAX_LOGGED_ERRORS:
        _LOGGED_ERRORS.add(message)
    logger.error("%s", message)


MERGED_FEEDS = 1024  # (category, rules matched together) whose ordered feeds are remembered
MAX_GROUPS = 20_000  # open groups per correlation at most, by default (least recently touched out)


@dataclass(frozen=True)
class Match:
    rule: LoadedRule
    events: tuple[dict[str, Any], ...]
    group: tuple[tuple[str, Any], ...] = ()  # correlation group-by (field, value) pairs
    window_start: str | None = None  # RFC 3339, correlations
    value: float | None = None  # the count/sum/avg that fired, correlations
    time: str | None = None  # RFC 3339, correlations: the event that completed it

    def __repr__(self) -> str:  # the rule's whole pySigma object would drown the output
        extra = f", group={self.group}, value={self.value}" if self.group or self.value else ""
        return f"Match(rule={self.rule.id!r}, events={len(self.events)}{extra})"


@dataclass(frozen=True)
class Feed:
    """Where a rule's matches go besides the output: a correlation, the source slot, and
    the correlation's position among the engine's."""

    correlation: Correlation
    source: int
    rank: int


@dataclass(frozen=True)
class Slot:
    rule: LoadedRule
    emit: bool
    feeds: tuple[Feed, ...]


def routed_category(rule: LoadedRule) -> tuple[bool, str | None]:
    """(routable, category); a rule of another product is not evaluated on our events.
    Read from the header: a cached rule of another product is never unpickled."""
    header = rule.header
    if header.kind != "detection":
        return False, None
    return (header.product or "").lower() == PRODUCT, header.category


class Engine:
    def __init__(
        self,
        ruleset: RuleSet,
        placeholders: dict[str, list] | None = None,
        *,
        max_groups: int | None = None,
        sample_size: int = 10,
        lateness: float | None = 0.0,
        clock: Clock | None = None,
        index_min: int = INDEX_MIN_RULES,
        lazy: bool = False,
        code_cache: Path | None = None,
        quiet: bool = False,
    ):
        """`max_groups` open groups per correlation (least recently touched evicted first),
        each keeping at most `sample_size` events as evidence: that bounds the memory.

        Correlations see their events in event-time order (reorder.py): `lateness` is how far
        behind the newest event time (or `clock`, for a live stream) an event may arrive and
        still be correlated; None holds everything until `flush()` (a whole input put in
        order); 0 puts each `evaluate()` call in order.

        A category with at least `index_min` rules (a keyword or regex rule counting as
        several: index.category_weight) is matched through the literal index (index.py): an
        event runs only the rules whose literals it shows.

        `lazy`: a category's match function is built when its first event arrives, not
        here, so categories that never see an event cost nothing (nor do their rules' pySigma
        objects, when the rule set came from the cache). A rule that cannot be compiled then
        is left out of its category with an error logged at its file:line, where the eager
        engine raises that error here. Each such error is kept in `compile_errors`; `quiet`:
        kept only, not logged (a scan's worker sends them to its caller, which logs them:
        `log_compile_error`).

        `code_cache`: a private directory where the compiled code of each category is kept
        by the hash of its source (codecache.py), so that a start with the same rules skips
        Python's compiler."""
        self.index_min = index_min
        self.code_cache = code_cache
        self.max_groups = max_groups = MAX_GROUPS if max_groups is None else max_groups
        self.sample_size = sample_size
        self.placeholders = dict(placeholders or {})
        self.stats = EngineStats()
        self.pending = ReorderBuffer(lateness, clock)
        self._expired_at = float("-inf")
        # Expiry bookkeeping (see _expire): at most the least `settled_until` of all the
        # correlations (feeding one lowers it to that one's where it is less).
        self._settled_until = float("inf")
        # the correlations with a group open (the others have nothing to expire), in order
        self._open: list[Correlation] = []
        self._merged: dict[tuple[int, tuple[int, ...]], tuple[Feed, ...]] = {}
        # fields each held match keeps a copy of, read while its event is in the CPU cache:
        # flush_parts.py sends them to a worker (set by a scan with workers; None: none kept)
        self.held_fields: tuple[str, ...] | None = None
        self._late_reported = 0
        detections = [r for r in ruleset.rules if r.kind == "detection"]
        filters = [r for r in ruleset.rules if r.kind == "filter"]
        correlation_rules = [r for r in ruleset.rules if r.kind == "correlation"]
        routed = [r for r in detections if routed_category(r)[0]]
        self.correlations: list[Correlation] = []
        feeds, silenced = self._wire_correlations(
            ruleset, correlation_rules, max_groups, sample_size
        )
        self.rules: list[LoadedRule] = routed + [c.rule for c in self.correlations]
        self._corr_slots = {
            c.rule.id: Slot(
                c.rule, c.rule.id not in silenced, self._ordered(feeds.get(c.rule.id, []))
            )
            for c in self.correlations
        }
        self._filters, self._feeds, self._silenced = filters, feeds, silenced
        self.lazy, self.quiet = lazy, quiet
        self.compile_errors: list[str] = []  # a lazy engine's rules left out, and why
        self._build_lock = threading.Lock()
        # the rules of each category whose match function is not built yet
        self._unbuilt: dict[str | None, list[LoadedRule]] = {}
        for rule in routed:
            self._unbuilt.setdefault(routed_category(rule)[1], []).append(rule)
        self._by_category: dict[str | None, tuple[Predicate, tuple[Slot, ...]]] = {}
        self._any_category: tuple[Predicate, tuple[Slot, ...]] | None = None
        if not lazy:
            for category in list(self._unbuilt):
                self._built(category)
        elif None in self._unbuilt:  # rules for every category: the first event needs them
            self._built(None)

    @property
    def built_categories(self) -> set[str | None]:
        """The categories whose match function is built (all of them unless `lazy`)."""
        return set(self._by_category) | ({None} if self._any_category else set())

    def _built(self, category: str | None) -> tuple[Predicate, tuple[Slot, ...]] | None:
        """The match function of `category`, built now if it is not yet; None when no rule
        has that category. Under a lock: two threads never build one category twice."""
        with self._build_lock:
            rules = self._unbuilt.pop(category, None)
            if rules is None:
                return self._any_category if category is None else self._by_category.get(category)
            with young_collected():
                entry = self._compile(category, rules)
            return_freed_memory()  # after the collection: what the compile let go is free
            if category is None:
                self._any_category = entry
            else:
                self._by_category[category] = entry
            return entry

    def _compile(
        self, category: str | None, rules: list[LoadedRule]
    ) -> tuple[Predicate, tuple[Slot, ...]]:
        """The match function of one category, with the slot of each of its rules."""
        rules = [rule for rule in rules if self._contained(rule, lambda r: r.sigma)]
        indexed = category_weight(rules) >= self.index_min
        builder = CategoryBuilder(_function_name(category), indexed, self.code_cache)
        compiled: list[LoadedRule] = []
        for rule in rules:
            if not self._contained(rule, lambda r: builder.add(self._trees(r, self._filters))):
                continue
            compiled.append(rule)
            rule.release()  # the match function does not need it (a cached rule re-reads it)
        try:
            function = builder.build()
        except (SyntaxError, RecursionError, MemoryError) as e:  # pathological rule sizes
            raise RuleError(
                f"the rules of category {category} are too large to compile: {e}",
                location(rules[0].path, rules[0].line),
            ) from e
        feeds, silenced = self._feeds, self._silenced
        slots = tuple(
            Slot(r, r.id not in silenced, self._ordered(feeds.get(r.id, []))) for r in compiled
        )
        return function, slots

    def _contained(self, rule: LoadedRule, step: Callable[[LoadedRule], object]) -> bool:
        """Run one compile step of `rule`; False when the rule cannot be compiled (its
        cache entry unreadable, a value the engine cannot evaluate): the eager engine raises
        that error at its file:line, the lazy one logs it and leaves the rule out."""
        try:
            try:
                step(rule)
            except (UnsupportedValue, SigmaError) as e:
                raise rule_error(rule, str(e)) from e
            except RecursionError as e:
                raise rule_error(rule, "condition is nested too deeply to evaluate") from e
        except RuleError as e:
            if not self.lazy:
                raise
            message = f"{e} (the rule is not evaluated)"
            self.compile_errors.append(message)
            if not self.quiet:
                log_compile_error(message)
            return False
        return True

    def _trees(self, rule: LoadedRule, filters: list[LoadedRule]) -> list[Any]:
        """The condition trees that must all hold for the rule: its own, then each filter's."""
        sigma = fill_placeholders(rule, self.placeholders)
        conditions = [c.parse() for c in sigma.detection.parsed_condition]
        return [_any_of(conditions)] + [
            filter_condition(f, self.placeholders) for f in filters if filter_applies(f, rule)
        ]

    def command_line_literals(self) -> frozenset[str]:
        """What the detection rules look for in a process's command line (cmdline_literals.py),
        for the process sensor to keep from a long one. A rule that cannot be read is left
        out (its compile reports it); a cached rule's pySigma object is let go again."""
        literals: set[str] = set()
        for rule in self.rules:
            if rule.kind != "detection" or not rule.header.reads_command_line:
                continue  # (known from the header: the rule's pySigma object stays unread)
            try:
                literals |= command_line_literals(self._trees(rule, self._filters))
            except (RuleError, UnsupportedValue, SigmaError, RecursionError):
                continue
            finally:
                rule.release()
        return frozenset(literals)

    @staticmethod
    def _ordered(feeds: list[Feed]) -> tuple[Feed, ...]:
        """Later steps of an ordered chain first, so that one event (matching two rules of a
        temporal_ordered correlation) never completes two steps at once."""
        return tuple(sorted(feeds, key=lambda f: -f.source))

    def _wire_correlations(
        self, ruleset: RuleSet, rules: list[LoadedRule], max_groups: int, sample_size: int
    ) -> tuple[dict[str, list[Feed]], set[str]]:
        feeds: dict[str, list[Feed]] = {}
        silenced: set[str] = set()
        for rule in rules:
            sigma = rule.sigma
            assert isinstance(sigma, SigmaCorrelationRule)
            refs = [r.reference for r in sigma.rules] if sigma.rules else referenced_rules(sigma)
            sources = []
            for ref in refs:
                source = ruleset.find(ref)
                if source is None or source.kind == "filter":
                    raise rule_error(rule, f"correlation refers to unknown rule '{ref}'")
                sources.append(source)
            kind = sigma.type.name.lower()
            if kind in ("value_percentile", "value_median"):
                raise rule_error(rule, f"correlation type {kind} is not supported")
            correlation = Correlation(rule, sources, self.stats, max_groups, sample_size)
            correlation.opened = self._opened
            correlation.rank = rank = len(self.correlations)
            self.correlations.append(correlation)
            for i, source in enumerate(sources):
                feeds.setdefault(source.id, []).append(Feed(correlation, i, rank))
                if not sigma.generate:
                    silenced.add(source.id)
        check_chains(self.correlations)
        return feeds, silenced

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(self, events: Iterable[dict[str, Any]]) -> list[Match]:
        out: list[Match] = []
        route = self._by_category.get
        unbuilt = self._unbuilt
        any_category = self._any_category
        hits_of = self._hits
        for event in events:
            try:
                category = event["event.category"]
                entry = route(category)
                if entry is None and category in unbuilt:  # its first event (lazy)
                    entry = self._built(category)
            except (KeyError, TypeError):  # no category, or a malformed unhashable one
                entry = None
            if entry is not None:
                hits = entry[0](event)
                if hits:
                    hits_of(entry[1], hits, event, out)
            if any_category is not None:
                hits = any_category[0](event)
                if hits:
                    hits_of(any_category[1], hits, event, out)
        if self.correlations:
            self._release(self.pending.due(), out)
        return out

    def _hits(
        self,
        slots: tuple[Slot, ...],
        hits: tuple[int, ...],
        event: dict[str, Any],
        out: list[Match],
    ) -> None:
        self.stats.rule_hits += len(hits)
        feeds: tuple[Feed, ...] = ()
        merged = False  # the feeds of more than one rule: put in order again
        for i in hits:
            slot = slots[i]
            if slot.emit:
                out.append(Match(slot.rule, (event,)))
            if slot.feeds:
                merged = bool(feeds)
                feeds += slot.feeds
        if not feeds:
            return
        t = epoch(event.get("@timestamp"))  # read only when a correlation needs it
        if t is None:
            self.stats.untimed_events += 1
            return
        if merged:
            feeds = self._merged_feeds(slots, hits, feeds)
        fields = self.held_fields  # what a worker would read of it (flush_parts.py)
        values = None if fields is None else tuple(map(event.get, fields))
        if not self.pending.push(t, event, (event, feeds, values)):
            self.stats.late_events += 1

    def _merged_feeds(
        self, slots: tuple[Slot, ...], hits: tuple[int, ...], feeds: tuple[Feed, ...]
    ) -> tuple[Feed, ...]:
        """The feeds of several rules one event matched, later steps of an ordered chain
        first (one event never completes two steps at once; a slot's own feeds are in that
        order already). Remembered per category and rules matched: the same few rules match
        together again and again. A category's slots live as long as the engine, so their
        id names them; at most MERGED_FEEDS are kept, forgotten all at once when full."""
        key = (id(slots), hits)
        ordered = self._merged.get(key)
        if ordered is None:
            if len(self._merged) >= MERGED_FEEDS:
                self._merged.clear()
            ordered = self._merged[key] = self._ordered(list(feeds))
        return ordered

    def _release(self, due: Iterable[tuple[float, Any]], out: list[Match]) -> None:
        """Feed the correlations the matches whose event time is settled, oldest first."""
        release_time = self.release_time
        for t, (event, feeds, _) in due:
            release_time(t, out)  # windows that closed before this event, in time order
            evidence = (event,)
            for feed in feeds:  # _feed, inline: once or twice for each match released
                correlation = feed.correlation
                fired = correlation.feed(feed.source, event, t, evidence)
                if correlation.settled_until < self._settled_until:
                    self._settled_until = correlation.settled_until
                if fired is not None:
                    self._fire(correlation, fired, out)

    def _feed(
        self,
        feed: Feed,
        event: dict[str, Any],
        t: float,
        evidence: tuple[dict[str, Any], ...],
        out: list[Match],
    ) -> None:
        fired = feed.correlation.feed(feed.source, event, t, evidence)
        if feed.correlation.settled_until < self._settled_until:
            self._settled_until = feed.correlation.settled_until
        if fired is not None:
            self._fire(feed.correlation, fired, out)

    def take_late(self) -> int:
        """Matches not correlated because they came later than the allowance, since the last
        call (what the agent reports as a `late_events` status event)."""
        late, self._late_reported = (
            self.stats.late_events - self._late_reported,
            (self.stats.late_events),
        )
        return late

    def _fire(self, correlation: Correlation, fired: Fired, out: list[Match]) -> None:
        slot = self._corr_slots[correlation.rule.id]
        group = correlation.group_pairs(fired.key)
        if slot.emit:
            out.append(
                Match(
                    correlation.rule,
                    fired.events,
                    group,
                    timestamp_text(fired.window_start),
                    fired.value,
                    timestamp_text(fired.time),
                )
            )
        # chaining: the outer correlation sees the inner one's group values at its fire time
        chained = {**dict(group), "@timestamp": timestamp_text(fired.time)}
        for feed in slot.feeds:
            self._feed(feed, chained, fired.time, fired.events, out)

    def _expire(self, now: float, out: list[Match]) -> None:
        """Each correlation, in order, expires what `now` has closed. A correlation keeps the
        event time up to which expiring changes nothing (its `settled_until`), and the
        engine the least of them: until `now` passes it no correlation is looked at (most
        event times), and then each in order, with the same result as looking at every one
        each time (a correlation fired here may feed a later one, which is looked at next)."""
        if now <= self._settled_until:
            return
        # The least is taken in the same walk. A fire here may feed a correlation already
        # walked: _feed lowers self._settled_until to it, from infinity, so that it counts
        # too (one it raised is then counted lower: at worst one more walk, never a miss).
        self._settled_until = least = float("inf")
        walked = self._open
        i = 0
        while i < len(walked):  # by index: a fire here may open a later correlation
            correlation = walked[i]
            i += 1
            if now > correlation.settled_until:  # else expire() would find nothing to do
                closed = correlation.expire(now)
                if closed and isinstance(out, StepMatches):
                    out.expiring(correlation.rank)
                for fired in closed:
                    self._fire(correlation, fired, out)
            if correlation.settled_until < least:
                least = correlation.settled_until
        if least < self._settled_until:
            self._settled_until = least
        inf = float("inf")
        self._open = [c for c in walked if c.settled_until != inf]

    def _opened(self, correlation: Correlation) -> None:
        """A correlation's first group opened: looked at in the expiry walks from now on, in
        the engine's order of correlations (a fire feeds later ones, looked at next)."""
        if correlation not in self._open:
            rank = self.correlations.index
            bisect.insort(self._open, correlation, key=rank)

    def flush(self) -> list[Match]:
        """End of input: correlate what is held, then close every open window (conditions
        decided at window end). flush_parts.py does the same in parts, in processes."""
        out: list[Match] = []
        self._release(self.pending.drain(), out)
        self.close_windows(self.correlations, out)
        return out

    def close_windows(self, correlations: list[Correlation], out: list[Match]) -> None:
        """Close every open window of `correlations` (in the engine's order), until none
        opens again (a chained correlation may open windows while inner ones close)."""
        tagged = out if isinstance(out, StepMatches) else None
        round_ = 0
        pending = True
        while pending:
            pending = False
            for correlation in correlations:
                closed = correlation.flush()
                if closed and tagged is not None:
                    tagged.closing(round_, correlation.rank)
                for fired in closed:
                    self._fire(correlation, fired, out)
                    pending = True
            round_ += 1

    # -- the end-of-input pass of some correlations alone (flush_parts.py) -------------------
    @property
    def expired_at(self) -> float:
        """The event time up to which windows were closed."""
        return self._expired_at

    def feeds_of(self, correlation: Correlation) -> tuple[Feed, ...]:
        """Where `correlation`'s own matches go: the correlations that refer to it."""
        return self._corr_slots[correlation.rule.id].feeds

    def feed_held(self, held: Iterable[tuple[float, Any]], out: list[Match]) -> None:
        """Feed matches taken from the buffer (`pending.drain()`), as `flush` does."""
        self._release(held, out)

    def start_part(self, correlations: list[Correlation], expired_at: float) -> None:
        """Feed, expire and close `correlations` alone from here on, from the state they had
        when the end-of-input pass began (expiry at `expired_at`): only they are walked at
        expiry, so another part's are left as they are."""
        self._expired_at = expired_at
        self._open = [c for c in correlations if c.groups]
        self._settled_until = min((c.settled_until for c in correlations), default=float("inf"))

    def release_time(self, t: float, out: list[Match]) -> None:
        """What `_release` does at a held match's time before feeding it: close the windows
        that ended before `t`."""
        if t > self._expired_at:
            self._expired_at = t
            if t > self._settled_until:  # else _expire() has nothing to do: not called
                self._expire(t, out)

    def feed_one(self, feed: Feed, event: dict[str, Any], t: float, out: list[Match]) -> None:
        """Feed one held match to one correlation, as `_release` does."""
        self._feed(feed, event, t, (event,), out)


class StepMatches(list[Match]):
    """The matches of one part of the end-of-input pass (flush_steps.py), each with the step
    of the one-process pass that made it (`steps`): (held match, 0, rank) for windows its
    time closed, (held match, 1, feed position) for its feeds, (held matches, 2, round, rank)
    for the closing rounds. A chained match carries the step of the match it came from."""

    def __init__(self) -> None:
        super().__init__()
        self.at = 0  # the held match being released (their count at the closing rounds)
        self.step: tuple[int, ...] = ()
        self.steps: list[tuple[int, ...]] = []

    def append(self, match: Match) -> None:
        super().append(match)
        self.steps.append(self.step)

    def expiring(self, rank: int) -> None:
        self.step = (self.at, 0, rank)

    def closing(self, round_: int, rank: int) -> None:
        self.step = (self.at, 2, round_, rank)


def _any_of(conditions: list[Any]) -> Any:
    """A rule's list of conditions means any of them."""
    if len(conditions) == 1:
        return conditions[0]
    return ConditionOR(conditions)


def _function_name(category: str | None) -> str:
    return "match_" + "".join(c if c.isalnum() else "_" for c in (category or "any_category"))
