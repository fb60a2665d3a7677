"""What compiling a category costs: the code generated for value lists, the string shapes
remembered, and the cyclic garbage collector while a category compiles."""

from __future__ import annotations

import gc
import weakref

import pytest
from sigma.types import SigmaString

from hpcsec.detector.engine import index
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.memory import young_collected
from hpcsec.detector.engine.values import UnsupportedValue, string_shape
from tests.detector.test_engine_semantics import HEADER, check, engine_for, ruleset

LITERALS = [f"tool{n:03d}.exe" for n in range(60)]


def test_value_lists_of_substrings_keep_each_values_semantics():
    """OR-ed substrings of one field are one test under one fallback: case, lists in
    events, numbers by their spelling and absent fields stay those of each value."""
    check(
        "sel:\n  process.command_line|contains: [' -Enc ', Invoke-, '4791']\ncondition: sel\n",
        [
            {"process.command_line": "powershell -enc AAA"},
            {"process.command_line": "INVOKE-expression"},
            {"process.command_line": ["a", "b invoke-x"]},
            {"process.command_line": 147910},
            {"process.command_line": [1, 24791]},
        ],
        [
            {"process.command_line": "powershell -encoded"},
            {"process.command_line": ["a", None, 4790]},
            {"process.command_line": True},
            {"process.command_line": None},
            {"process.name": "invoke-x"},
        ],
    )


def test_a_long_substring_list_compiles_to_one_fallback():
    """Sixty substrings of one field: one check of the field and one fallback for values
    that are not strings, not sixty (the code Python's compiler spent most of its time on
    for SigmaHQ's lists of hashes)."""
    values = "".join(f"\n    - {literal}" for literal in LITERALS)
    engine = engine_for(f"sel:\n  process.command_line|contains:{values}\ncondition: sel\n")
    match, _ = engine._built("process")
    source = match.source  # type: ignore[attr-defined]
    assert source.count(" is not None and k") == 1
    assert all(f"{literal!r} in " in source for literal in LITERALS)
    assert fires_on(engine, "c:\\TOOL059.EXE -x") and not fires_on(engine, "tool060.exe")
    assert fires_on(engine, ["x", "a tool000.exe"]) and not fires_on(engine, 59)


def fires_on(engine: Engine, value: object) -> bool:
    event = {"event.category": "process", "process.command_line": value}
    return bool(engine.evaluate([event]))


def test_string_shapes_are_remembered_by_their_parts_and_case():
    folded = string_shape(SigmaString("*Invoke-*"), lower=True)
    assert folded == ("contains", "invoke-")
    assert string_shape(SigmaString("*Invoke-*"), lower=False) == ("contains", "Invoke-")
    assert string_shape(SigmaString("*Invoke-*"), lower=True) is folded
    assert string_shape(SigmaString("Invoke-*"), lower=True) == ("startswith", "invoke-")
    glob = string_shape(SigmaString("a*b?c"), lower=True)
    assert glob[0] == "glob" and glob[1].matches("aXXbYc") and not glob[1].matches("abc")


def test_a_placeholder_is_still_refused():
    value = SigmaString("%admins%").insert_placeholders()
    with pytest.raises(UnsupportedValue, match="unfilled placeholder %admins%"):
        string_shape(value, lower=True)


def test_the_collector_is_off_while_a_category_compiles(monkeypatch):
    """Left on, the objects a compile keeps set off full collections of the whole heap;
    it is off for the compile and on again after it."""
    seen = []
    build = index.CategoryBuilder.build

    def watched(self):
        seen.append(gc.isenabled())
        return build(self)

    monkeypatch.setattr(index.CategoryBuilder, "build", watched)
    assert gc.isenabled()
    engine = Engine(ruleset(HEADER + "detection:\n  sel:\n    process.name: x\n  condition: sel\n"))
    assert seen == [False]
    assert gc.isenabled()
    assert fires_on_name(engine, "X")


def fires_on_name(engine: Engine, name: str) -> bool:
    return bool(engine.evaluate([{"event.category": "process", "process.name": name}]))


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_the_garbage_a_compile_makes_is_collected_after_it():
    """Condition trees and released pySigma objects are cyclic (parent links): the young
    collection at the end frees what the compile let go."""
    assert gc.isenabled()
    with young_collected():
        assert not gc.isenabled()
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None  # no collection while the compile runs
    assert gc.isenabled()
    assert gone() is None


def test_a_compile_inside_a_paused_collector_leaves_it_paused():
    gc.disable()
    try:
        with young_collected():
            a = Node()
            a.other = a
            gone = weakref.ref(a)
            del a
        assert not gc.isenabled()
        assert gone() is not None  # nothing collected: the caller had paused the collector
    finally:
        gc.enable()
        gc.collect()


def test_wildcards_in_a_row_are_one():
    """`**` is `*` (it was read as a prefix or substring test of a wildcard, which failed
    with a TypeError or matched nothing)."""
    assert string_shape(SigmaString("**"), lower=True) == ("any", "")
    assert string_shape(SigmaString("***"), lower=True) == ("any", "")
    assert string_shape(SigmaString("a**"), lower=True) == ("startswith", "a")
    assert string_shape(SigmaString("**a**"), lower=True) == ("contains", "a")
    check("sel:\n  process.name: '**'\ncondition: sel\n", [{"process.name": "x"}], [{}])
