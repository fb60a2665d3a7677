"""RuleSet, RuleTest and EventSequence are written without `dataclasses` (start-up of `rules list`
and `config check`, core/record.py) and must behave as the dataclasses they replace: the same
constructor, equality, hash, repr, immutability and pickling."""

from __future__ import annotations

import copy
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from hpcsec.detector.cli.rules import FIELD_MAP_NAMES
from hpcsec.detector.core.errors import RuleError
from hpcsec.detector.engine.fieldmaps import FIELD_MAPS
from hpcsec.detector.engine.ruleset import EventSequence, RuleSet, RuleTest


@dataclass(frozen=True)
class EventSequenceDC:  # what they were
    events: tuple[dict[str, Any], ...]
    expect_match: bool
    line: int


@dataclass(frozen=True)
class RuleTestDC:
    rule_id: str
    match: tuple[dict[str, Any], ...]
    nomatch: tuple[dict[str, Any], ...]
    path: str
    line: int
    match_lines: tuple[int, ...] = ()
    nomatch_lines: tuple[int, ...] = ()
    sequences: tuple[EventSequence, ...] = ()
    placeholders: dict[str, list[Any]] = field(default_factory=dict, compare=False)


@dataclass
class RuleSetDC:
    rules: list[Any] = field(default_factory=list)
    tests: list[Any] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    errors: list[RuleError] = field(default_factory=list)


SEQUENCE = ((({"a": 1},), True, 3), {})
TESTS = [
    (("r1", ({"x": 1},), (), "t.yml", 2), {}),
    (("r1", (), ({"x": 2},), "t.yml", 2, (4,), (7,)), {"placeholders": {"p": ["v"]}}),
    (("r1", (), (), "t.yml", 2), {"sequences": (EventSequence(({"a": 1},), False, 9),)}),
]


def same_repr(ours: object, theirs: object) -> None:
    name = type(ours).__name__
    assert repr(ours) == repr(theirs).replace(type(theirs).__name__, name, 1)


@pytest.mark.parametrize(("args", "kwargs"), [SEQUENCE, *TESTS])
def test_frozen_records_are_the_dataclasses(args, kwargs) -> None:
    cls, reference = (EventSequence, EventSequenceDC) if len(args) == 3 else (RuleTest, RuleTestDC)
    ours, theirs = cls(*args, **kwargs), reference(*args, **kwargs)
    same_repr(ours, theirs)
    assert ours == cls(*args, **kwargs) and ours != theirs
    with pytest.raises(AttributeError):
        ours.line = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del ours.line  # type: ignore[misc]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(ours, protocol=protocol))
        assert back == ours and repr(back) == repr(ours)
    assert copy.deepcopy(ours) == ours and copy.copy(ours) == ours


def test_rule_test_placeholders_are_not_compared_and_not_shared() -> None:
    args = ("r1", (), (), "t.yml", 2)
    a, b = RuleTest(*args), RuleTest(*args, placeholders={"p": ["v"]})
    assert a == b and RuleTestDC(*args) == RuleTestDC(*args, placeholders={"p": ["v"]})
    assert a.placeholders == {} and a.placeholders is not RuleTest(*args).placeholders
    assert hash(EventSequence((), True, 1)) == hash(EventSequenceDC((), True, 1))
    assert hash(RuleTest("r", (), (), "p", 1)) == hash(RuleTestDC("r", (), (), "p", 1))
    with pytest.raises(TypeError):
        hash(RuleTest(*TESTS[0][0]))  # events are dicts: unhashable, as the dataclass's


def test_rule_set_is_the_mutable_dataclass() -> None:
    error = RuleError("bad")
    ours, theirs = (
        RuleSet(["r"], files=["f.yml"], errors=[error]),
        RuleSetDC(["r"], files=["f.yml"], errors=[error]),
    )
    same_repr(ours, theirs)
    assert ours == RuleSet(rules=["r"], tests=[], files=["f.yml"], errors=[error])
    assert ours != RuleSet() and RuleSet() == RuleSet()
    rules: list[Any] = []
    assert RuleSet(rules).rules is rules  # the list given, not a copy
    empty = RuleSet()
    empty.rules.append("x")
    assert RuleSet().rules == [] and empty.rules == ["x"]  # no shared default
    ours.rules = ["s"]
    assert ours.rules == ["s"]
    with pytest.raises(TypeError):
        hash(ours)
    with pytest.raises(AttributeError):
        ours.other = 1  # type: ignore[attr-defined]


def test_field_map_names_are_the_tables() -> None:
    assert tuple(FIELD_MAPS) == FIELD_MAP_NAMES
