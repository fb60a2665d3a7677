"""A rule with two AND-ed parts that each need a literal is a candidate of the literal index
(engine/index.py) only when the event shows a literal of each: a literal most values show
(`\\program files`) does not make it run for most events, and nothing it can match is lost."""

from __future__ import annotations

from typing import Any

from index_rules import condition_of, rule
from sigma.collection import SigmaCollection

from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.index import CategoryBuilder, indexed_predicate, required_groups
from hpcsec.detector.engine.literal_index import LiteralIndex
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

PATH = "file.path"
OFFICE = {
    "place": {f"{PATH}|contains": ["\\Program Files", "\\Word\\Startup"]},
    "ext": {f"{PATH}|endswith": [".xlam", ".wll"]},
}


def test_and_needs_a_key_of_each_part_the_most_selective_first():
    groups = required_groups(condition_of({**OFFICE, "condition": "place and ext"}))
    assert groups == [
        {(PATH, "contains", "\\program files"), (PATH, "contains", "\\word\\startup")},
        {(PATH, "endswith", ".xlam"), (PATH, "endswith", ".wll")},
    ]


def test_or_of_ands_needs_a_key_of_each_branch_group():
    detection = {
        "a1": {"process.name": "nc"},
        "a2": {"process.args|contains": "-e"},
        "b1": {"process.name": "socat"},
        "b2": {"process.args|contains": "exec:"},
        "condition": "(a1 and a2) or (b1 and b2)",
    }
    groups = required_groups(condition_of(detection))
    assert groups == [
        {("process.name", "eq", "nc"), ("process.name", "eq", "socat")},
        {("process.args", "contains", "-e"), ("process.args", "contains", "exec:")},
    ]


def test_parts_without_keys_add_no_group():
    negated = {**OFFICE, "condition": "place and not ext"}
    assert required_groups(condition_of(negated)) == [
        {(PATH, "contains", "\\program files"), (PATH, "contains", "\\word\\startup")}
    ]
    either = {**OFFICE, "any": {"user.name|re": "^(?=x)"}, "condition": "place or not ext"}
    assert required_groups(condition_of(either)) == []


def test_a_rule_runs_only_when_the_event_shows_a_key_of_both_groups():
    first = frozenset({(PATH, "contains", "\\program files")})
    second = frozenset({(PATH, "endswith", ".xlam")})  # used as given here
    ran: list[str] = []

    def test(event: dict[str, Any]) -> bool:
        ran.append(event[PATH])
        return True

    match = indexed_predicate(
        LiteralIndex([first, second]), [test], [0], None, [], paired=frozenset({0})
    )
    assert match({PATH: "c:\\program files\\app\\app.exe"}) == ()
    assert match({PATH: "c:\\users\\bob\\evil.xlam"}) == ()
    assert match({PATH: "C:\\Program Files\\Office\\evil.XLAM"}) == (0,)
    assert ran == ["C:\\Program Files\\Office\\evil.XLAM"]


def test_a_second_group_is_used_only_when_it_is_cheap_to_look_up():
    builder = CategoryBuilder("groups", indexed=True)
    loader = {f"{PATH}|contains": "macro_loader"}
    builder.add([condition_of({**OFFICE, "loader": loader, "condition": "place and loader"})])
    builder.add([condition_of({**OFFICE, "condition": "place and ext"})])
    only = {"a": {"process.name": "nc"}, "b": {"user.name": "root"}, "condition": "a and b"}
    builder.add([condition_of(only)])
    pattern = {**OFFICE, "re": {f"{PATH}|re": "[0-9]{8}"}, "condition": "place and re"}
    builder.add([condition_of(pattern)])
    seconds = builder.second_groups()
    assert seconds[0] == {
        (PATH, "contains", "\\program files"),
        (PATH, "contains", "\\word\\startup"),
    }
    assert seconds[1] is None  # extensions: most paths show one, a hit each new text
    assert seconds[2] is None  # user.name is probed for no rule's first group
    assert seconds[3] is None  # a pattern would be searched in every new text of the field


DETECTIONS: list[dict[str, Any]] = [
    {**OFFICE, "condition": "place and ext"},
    {**OFFICE, "condition": "place and not ext"},
    {**OFFICE, "other": {"process.name": "winword.exe"}, "condition": "(place and ext) or other"},
    {
        "a1": {"process.name": "nc"},
        "a2": {"process.args|contains": "-e"},
        "b1": {"process.name|startswith": "soc"},
        "b2": {"process.args|re": "(?i)EXEC:"},
        "condition": "(a1 and a2) or (b1 and b2)",
    },
    {
        "a": {"process.name": "nc"},
        "b": {f"{PATH}|contains": "\\Program Files"},
        "c": {f"{PATH}|endswith": ".xlam"},
        "condition": "a and (b and c)",
    },
    {
        "a": {"process.name": ["nc", "ncat"]},
        "b": {"process.args|contains": "-e"},
        "condition": "all of them",
    },
]
EVENTS: list[dict[str, Any]] = [
    {PATH: "C:\\Program Files\\Office\\a.xlam"},
    {PATH: "C:\\Program Files\\Office\\a.exe"},
    {PATH: "C:\\Users\\bob\\a.xlam"},
    {PATH: "C:\\Word\\Startup\\x.WLL", "process.name": "winword.exe"},
    {"process.name": "nc", "process.args": "-e /bin/sh"},
    {"process.name": "nc", "process.args": "-l"},
    {"process.name": "socat", "process.args": "exec:/bin/sh"},
    {"process.name": "socat", "process.args": "-e"},
    {"process.name": "nc", "process.args": "-e", PATH: "c:\\program files\\x.xlam"},
    {"process.name": "ncat", "process.args": ["-l", "-e"]},
    {"process.name": "NC", PATH: "\\program files\\a.XLAM\udcff"},
]


def test_indexed_engine_with_groups_matches_what_the_compiled_path_matches():
    collection = SigmaCollection.from_dicts([rule(n, d) for n, d in enumerate(DETECTIONS)])
    ruleset = RuleSet([LoadedRule(r, "<groups>", 1, "test") for r in collection.rules])
    indexed, plain = Engine(ruleset, index_min=1), Engine(ruleset, index_min=10**6)
    events = [{"event.category": "process", **e} for e in EVENTS]
    got = [sorted(m.rule.id for m in indexed.evaluate([e])) for e in events]
    assert got == [sorted(m.rule.id for m in plain.evaluate([e])) for e in events]
    ids = [str(r.id) for r in collection.rules]
    assert got[0] == [ids[0], ids[2]]
    assert got[1] == [ids[1]]
    assert got[4] == [ids[3], ids[5]]
    assert got[8] == [ids[0], ids[2], ids[3], ids[4], ids[5]]
