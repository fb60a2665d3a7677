"""Correlation state (Sigma correlation spec v2.1) on event time (`@timestamp`).

State is kept per group (the `group-by` values), never per event: a group holds counters, the
last N timestamps where N is the threshold, distinct values with their last-seen time, per-rule
last-seen times, or time buckets of sums, plus a bounded sample of recent events as evidence.
Open groups are capped (least recently touched first out, counted as evictions) and expire as
event time moves past their window.

Windows. Conditions that can only become true as events arrive (`gt`, `gte`) are tested on a
sliding window ending at each event: exact for event_count, value_count, temporal and
temporal_ordered; value_sum/value_avg slide by buckets of 1/32 of the timespan. The others
(`lt`, `lte`, `eq`, `neq`) can only be decided once a window is over, so they use a window that
opens at the group's first event and closes `timespan` later (or at `flush`); so do extended
temporal conditions with a `not`. A correlation fires once per group and window and then starts
that group afresh. (value_percentile and value_median are not supported.)
"""

from __future__ import annotations

import bisect
import operator
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from sigma.correlations import (
    CorrelationConditionAND,
    CorrelationConditionNOT,
    CorrelationConditionOR,
    SigmaCorrelationCondition,
    SigmaCorrelationRule,
    SigmaExtendedCorrelationCondition,
    SigmaRuleReference,
)

from hpcsec.detector.engine.groups import EngineStats, Fired, Group, group_key, hashable
from hpcsec.detector.engine.matchers import as_number
from hpcsec.detector.engine.prepare import rule_error
from hpcsec.detector.engine.ruleset import LoadedRule

BUCKETS = 32
RELATIONS: dict[str, Callable[[Any, Any], bool]] = {
    "LT": operator.lt,
    "LTE": operator.le,
    "GT": operator.gt,
    "GTE": operator.ge,
    "EQ": operator.eq,
    "NEQ": operator.ne,
}


class Correlation:
    """The running state of one correlation rule."""

    def __init__(
        self,
        rule: LoadedRule,
        sources: list[LoadedRule],
        stats: EngineStats,
        max_groups: int,
        sample_size: int,
    ):
        sigma = rule.sigma
        assert isinstance(sigma, SigmaCorrelationRule)
        self.rule = rule
        self.rank = 0  # its position among its engine's correlations (set by the engine)
        self.kind = sigma.type.name.lower()
        self.span = float(sigma.timespan.seconds)
        self.group_by = tuple(sigma.group_by or ())
        self.stats = stats
        self.max_groups = max_groups
        self.sample_size = sample_size
        self.groups: OrderedDict[tuple[Any, ...], Group] = OrderedDict()
        # Event time up to which expire() is known to change nothing: the window end of the
        # first group (the least recently touched), which is all expire() looks at before it
        # stops. feed() keeps it so, so the engine asks a correlation to expire only once
        # event time has passed that end, with the same result as asking it at every event.
        self.settled_until = float("inf")
        # called with this correlation when its first group opens (none were open): the
        # engine then looks at it in its expiry walks, until no group is open again
        self.opened: Callable[[Correlation], None] = _nothing
        self.sources = sources
        self.source_count = len(sources)
        self.fields_by_source = [self._group_fields(sigma, src) for src in sources]
        self.keys_by_source = [group_key(fields) for fields in self.fields_by_source]
        condition = sigma.condition
        self.extended = None
        # value_count/sum/avg: the field (or fields) counted or summed
        self.field: str | tuple[str, ...] | None
        if isinstance(condition, SigmaExtendedCorrelationCondition):
            names = [self._ref_index(sigma, r) for r in condition.get_referenced_rules()]
            self.extended = (
                condition.parsed,
                dict(zip(condition.get_referenced_rules(), names, strict=True)),
            )
            self.op, self.threshold, self.field = "GTE", 1, None
        else:
            assert isinstance(condition, SigmaCorrelationCondition)
            self.op, self.threshold = condition.op.name, condition.count
            ref = condition.fieldref
            self.field = tuple(ref) if isinstance(ref, list) else ref
        # "a and not b" can only be known once b has had the whole window to show up
        self.sliding = self.op in ("GT", "GTE") and not (
            self.extended is not None and has_negation(self.extended[0])
        )
        self.relation = RELATIONS[self.op]
        self._add_kind = {
            "event_count": self._add_events,
            "value_count": self._add_value,
            "temporal": self._add_seen,
            "temporal_ordered": self._add_ordered,
        }.get(self.kind, self._add_sum)

    def _ref_index(self, sigma: SigmaCorrelationRule, ref: str) -> int:
        for i, src in enumerate(self.sources):
            if ref in (src.id, getattr(src.sigma, "name", None)):
                return i
        raise KeyError(ref)

    def _group_fields(self, sigma: SigmaCorrelationRule, source: LoadedRule) -> tuple[str, ...]:
        """Group-by names as this source's events spell them (`aliases`)."""
        names = []
        for name in self.group_by:
            alias = sigma.aliases.aliases.get(name)
            mapped = name
            if alias is not None:
                for ref, field_name in alias.mapping.items():
                    if ref.reference in (source.id, getattr(source.sigma, "name", None)):
                        mapped = field_name
            names.append(mapped)
        return tuple(names)

    # -- feeding ----------------------------------------------------------------------------
    def feed(
        self, source: int, event: dict[str, Any], t: float, evidence: tuple[dict[str, Any], ...]
    ) -> Fired | None:
        key = self.keys_by_source[source](event)
        groups = self.groups
        try:
            group = groups.get(key)
        except TypeError:  # a list or object among the values: make it hashable
            key = tuple(hashable(v) for v in key)
            group = groups.get(key)
        fired = None
        # Whether the first group (the least recently touched: its window end is
        # settled_until) may have changed. A new group that evicts none and does not fire is
        # the last: it changes the first only when it is the only one.
        first_changed = True
        if group is not None:
            # Event time may arrive out of order (several nodes' events merged, a replayed
            # file). An event older than the window of the group's newest event, or than an
            # open closing window, can share no window with them: it is counted, not added.
            if t < (group.last - self.span if self.sliding else group.start):
                self.stats.late_events += 1
                return None
            if not self.sliding and t > group.start + self.span:
                fired = self._close(key, group)
                group = None
            else:
                groups.move_to_end(key)
        if group is None:  # Group(), inline: a new group for most events of many correlations
            group = groups[key] = Group(t, self.kind, self.source_count, self.sample_size)
            if len(groups) > self.max_groups:
                groups.popitem(last=False)
                self.stats.evicted_groups += 1
            elif len(groups) == 1:
                self.opened(self)
            elif fired is None:
                first_changed = False
        if t > group.last:
            group.last = t
        if len(evidence) == 1:
            group.sample.append((t, evidence[0]))
        else:
            group.sample.extend((t, ev) for ev in evidence)
        value = self._add_kind(group, source, event, t)
        if value is not None and self.sliding and self.relation(value[0], self.threshold):
            del groups[key]
            fired = self._fired(key, group, value[1], t, value[0])
            first_changed = True
        if first_changed:  # settled_until as expire() would leave it
            for first in groups.values():
                self.settled_until = (first.last if self.sliding else first.start) + self.span
                break
            else:
                self.settled_until = float("inf")
        return fired

    # -- accounting one event per kind (chosen once, as _add_kind): each returns, for sliding
    # windows, (aggregate, window start) --------------------------------------------------
    def _add_events(
        self, g: Group, source: int, event: dict[str, Any], t: float
    ) -> tuple[float, float] | None:
        g.count += 1
        if not self.sliding:
            return None
        times = g.times
        assert times is not None  # made for event_count groups
        if not times or t >= times[-1]:
            times.append(t)
        else:  # a late event (within the window): keep the times sorted
            bisect.insort(times, t)
        low = g.last - self.span
        while times and times[0] < low:
            times.popleft()
        while len(times) > self.threshold + 1:
            times.popleft()
        return len(times), times[0]

    def _add_value(
        self, g: Group, source: int, event: dict[str, Any], t: float
    ) -> tuple[float, float] | None:
        g.count += 1
        field = self.field
        value: Any
        if isinstance(field, tuple):
            value = tuple(map(event.get, field))
        else:
            value = None if field is None else event.get(field)
        if value.__class__ is not str:
            value = hashable(value)
        if value is None:
            return None
        values = g.values
        assert values is not None  # made for value_count groups
        if not self.sliding and value not in values and len(values) > self.threshold:
            return None  # min(count, threshold + 1) decides every condition: saturate
        previous = values.pop(value, None)
        # insertion order = last-seen order; a late event does not make a value newer
        values[value] = t if previous is None or t > previous else previous
        if self.sliding:
            low = g.last - self.span
            while True:  # oldest first; at most threshold+1 are needed to decide
                old = next(iter(values))
                if values[old] >= low and len(values) <= self.threshold + 1:
                    break
                del values[old]
            return len(values), values[old]
        return None

    def _add_ordered(
        self, g: Group, source: int, event: dict[str, Any], t: float
    ) -> tuple[float, float] | None:
        g.count += 1
        low = g.last - self.span
        chain = g.chain  # chain[i]: latest start of an in-order chain that reached rule i
        reached_at = g.reached_at  # reached_at[i]: event time of that chain's step i
        assert chain is not None and reached_at is not None  # temporal_ordered groups
        if source == 0:
            if chain[0] is None or t >= chain[0]:
                chain[0] = reached_at[0] = t
        else:
            previous = chain[source - 1]
            if (
                previous is not None and previous >= t - self.span and reached_at[source - 1] <= t
            ):  # in order of event time, not of arrival
                chain[source] = previous
                reached_at[source] = t
        reached, start = 0, t  # the furthest step a chain still in the window reached
        for i, chain_start in enumerate(chain):
            if chain_start is not None and chain_start >= low:
                reached, start = i + 1, chain_start
        return reached, start

    def _add_seen(
        self, g: Group, source: int, event: dict[str, Any], t: float
    ) -> tuple[float, float] | None:
        g.count += 1
        seen = g.seen
        assert seen is not None  # made for temporal groups
        if t > seen.get(source, float("-inf")):
            seen[source] = t
        if self.sliding:
            low = g.last - self.span
            if len(seen) > 1:
                for i in [i for i, last in seen.items() if last < low]:
                    del seen[i]
            if self.extended is None:
                return len(seen), min(seen.values())
        return self._temporal_value(g), min(seen.values())

    def _add_sum(
        self, g: Group, source: int, event: dict[str, Any], t: float
    ) -> tuple[float, float] | None:
        field = self.field  # value_sum / value_avg name one field
        number = as_number(event.get(field)) if isinstance(field, str) else None
        if number is None:
            return None
        g.count += 1
        buckets = g.buckets
        assert buckets is not None  # made for value_sum/value_avg groups
        width = self.span / BUCKETS if self.sliding else float("inf")
        if buckets and t < buckets[-1][0] + width:
            buckets[-1][1] += number
            buckets[-1][2] += 1
        else:
            buckets.append([t, number, 1])
        if not self.sliding:
            return None
        low = g.last - self.span
        while buckets and buckets[0][0] + width <= low:
            buckets.popleft()
        return self._sum_value(g), buckets[0][0]

    def _sum_value(self, g: Group) -> float:
        buckets = g.buckets or ()
        total = sum(b[1] for b in buckets)
        if self.kind == "value_avg":
            n = sum(b[2] for b in buckets)
            return total / n if n else 0.0
        return total

    def _temporal_value(self, g: Group) -> float:
        seen = g.seen or {}
        if self.extended is None:
            return len(seen)
        tree, index = self.extended
        return 1 if evaluate_extended(tree, index, seen) else 0

    # -- closing windows ----------------------------------------------------------------------
    def _closing_value(self, g: Group) -> float:
        if self.kind == "event_count":
            return g.count
        if self.kind == "value_count":
            return len(g.values or ())
        if self.kind == "temporal":
            return self._temporal_value(g)
        if self.kind == "temporal_ordered":
            chain = g.chain or ()
            return max((i + 1 for i, s in enumerate(chain) if s is not None), default=0)
        return self._sum_value(g)

    def _close(self, key: tuple[Any, ...], g: Group) -> Fired | None:
        self.groups.pop(key, None)
        value = self._closing_value(g)
        if g.count and self.relation(value, self.threshold):
            return self._fired(key, g, g.start, g.last, value)
        return None

    def expire(self, now: float) -> list[Fired]:
        """Drop (sliding) or close (other conditions) groups whose window has passed: the
        least recently touched first, found in one walk (no iterator made per group)."""
        span, sliding = self.span, self.sliding
        self.settled_until = float("inf")
        passed = []
        for key, group in self.groups.items():
            edge = (group.last if sliding else group.start) + span
            if edge >= now:
                self.settled_until = edge
                break
            passed.append((key, group))
        if sliding:
            groups = self.groups
            for key, _ in passed:
                del groups[key]
            return []
        fired = [self._close(key, group) for key, group in passed]
        return [f for f in fired if f is not None]

    def flush(self) -> list[Fired]:
        self.settled_until = float("inf")  # no group is left open
        if self.sliding:
            self.groups.clear()
            return []
        fired = [self._close(key, g) for key, g in list(self.groups.items())]
        return [f for f in fired if f is not None]

    def _fired(self, key: tuple[Any, ...], g: Group, start: float, t: float, value: float) -> Fired:
        events = tuple(ev for seen, ev in g.sample if seen >= start)
        return Fired(key, events, start, t, float(value))

    def group_pairs(self, key: tuple[Any, ...]) -> tuple[tuple[str, Any], ...]:
        return tuple(zip(self.group_by, key, strict=True))


def _nothing(correlation: Correlation) -> None:
    """The default `opened`: a correlation of no engine."""


def has_negation(node: Any) -> bool:
    if isinstance(node, CorrelationConditionNOT):
        return True
    return any(has_negation(a) for a in getattr(node, "args", ()))


def evaluate_extended(node: Any, index: dict[str, int], seen: dict[int, float]) -> bool:
    if isinstance(node, SigmaRuleReference):
        return index[node.reference] in seen
    if isinstance(node, CorrelationConditionAND):
        return all(evaluate_extended(a, index, seen) for a in node.args)
    if isinstance(node, CorrelationConditionOR):
        return any(evaluate_extended(a, index, seen) for a in node.args)
    if isinstance(node, CorrelationConditionNOT):
        return not evaluate_extended(node.args[0], index, seen)
    raise TypeError(f"unexpected correlation condition element {type(node).__name__}")


def check_chains(correlations: list[Correlation]) -> None:
    """A correlation must not (through others) refer to itself: it would feed itself."""
    refers = {c.rule.id: [s.id for s in c.sources if s.kind == "correlation"] for c in correlations}

    def walk(rule_id: str, path: tuple[str, ...]) -> None:
        for ref in refers.get(rule_id, ()):
            if ref in path:
                rule = next(c.rule for c in correlations if c.rule.id == ref)
                chain = " -> ".join((*path[path.index(ref) :], ref))
                raise rule_error(rule, f"correlation chain refers to itself: {chain}")
            walk(ref, (*path, ref))

    for rule_id in refers:
        walk(rule_id, (rule_id,))
