"""The literal index against a plain reading of its keys, over random keys and hostile events:
field names and values holding control characters (the ASCII record and unit separators
among them), characters whose case folding changes their length ('İ') or maps them onto ASCII
(the Kelvin sign), lone surrogates, lists, numbers, objects and very long values. Whatever the
event, the candidates are exactly the rules one of whose keys the event shows, whether the
texts are probed anew or remembered."""

from __future__ import annotations

import random
from typing import Any

import pytest

from hpcsec.detector.engine import literal_index
from hpcsec.detector.engine.literal_index import Key, LiteralIndex, probe_texts

# what texts, names and literals are made of: ASCII, the record and unit separators, NUL, and
# characters whose lower case is longer ('İ'), ASCII (the Kelvin sign) or depends on what
# follows (capital sigma), and a lone surrogate
ALPHABET = ["a", "b", "C", "\\", " ", ".", "\x1e", "\x1f", "\x00", "İ", "ß", "\u212a", "\u03a3"]
ALPHABET += ["\ud800"]
NAMES = ["Image", "image", "a\x1eb", "x\x1f", "", "İmage", "\u212aey", "\ud800n"]
KINDS = ("eq", "contains", "startswith", "endswith")


def text(rng: random.Random, longest: int = 6) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, longest)))


def random_keys(rng: random.Random) -> frozenset[Key]:
    keys = set()
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(KINDS)
        literal = text(rng, 3).lower()  # keys are case-folded (index.leaf_keys)
        if kind != "eq" and not literal:  # an empty affix is no key (index.leaf_keys)
            literal = "a"
        keys.add((rng.choice(NAMES), kind, literal))
    return frozenset(keys)


def random_value(rng: random.Random, literals: list[str]) -> Any:
    """A value that often shows a literal of the keys: as it is, upper-cased, between other
    text, at the very end of a long value, as a list element, or a non-string."""
    literal = rng.choice(literals)
    shape = rng.randrange(8)
    if shape == 0:
        return literal.upper()
    if shape == 1:
        return text(rng) + literal + text(rng)
    if shape == 2:
        return "x" * 5000 + literal
    if shape == 3:
        return [text(rng), None, 7, literal, {"k": literal}]
    if shape == 4:
        return rng.choice([5, 2.5, True, None, {"k": literal}, []])
    if shape == 5:
        return literal + literal  # overlapping and repeated occurrences
    return text(rng)


def shows(kind: str, literal: str, texts: Any) -> bool:
    tests = {
        "eq": lambda t: t == literal,
        "contains": lambda t: literal in t,
        "startswith": lambda t: t.startswith(literal),
        "endswith": lambda t: t.endswith(literal),
    }
    return any(map(tests[kind], texts))


def expected(rules: list[frozenset[Key]], event: dict[str, Any]) -> set[int]:
    """The rules one of whose keys the event shows, read plainly: the field's value exactly
    by its name, its case-folded texts (each element of a list; objects none)."""
    found = set()
    for position, keys in enumerate(rules):
        for field, kind, literal in keys:
            value = event.get(field)
            if value is None or value.__class__ is dict:
                continue
            if shows(kind, literal, probe_texts(value)):
                found.add(position)
    return found


def check_random_indexes(seed: int) -> None:
    """150 random indexes, 20 random events each: the candidates, probed anew and then from
    what the index remembers, are exactly the rules whose keys the event shows."""
    rng = random.Random(seed)
    for _ in range(150):
        rules = [random_keys(rng) for _ in range(rng.randint(1, 12))]
        literals = [literal for keys in rules for _, _, literal in keys]
        index = LiteralIndex(rules)
        for _ in range(20):
            names = rng.sample(NAMES, rng.randint(1, len(NAMES)))
            event = {name: random_value(rng, literals) for name in names}
            want = expected(rules, event)
            assert index.candidates(event) == want, (rules, event)
            assert index.candidates(event) == want, (rules, event)  # remembered texts


def test_candidates_are_exactly_the_rules_whose_keys_hostile_events_show():
    check_random_indexes(20261201)


def test_a_separator_in_a_value_or_a_name_hides_no_key():
    """Values and names that hold the separators, end on a literal, are a literal, or are
    empty: each key they show is found."""
    rules = [
        frozenset({("a\x1eb", "eq", "")}),
        frozenset({("Image", "eq", "x\x1e")}),
        frozenset({("Image", "endswith", "\\ab")}),
        frozenset({("x\x1f", "startswith", "\x1f")}),
        frozenset({("Image", "contains", "b\x1f\x1ec")}),
        frozenset({("image", "contains", "aa")}),
    ]
    index = LiteralIndex(rules)
    assert index.candidates({"a\x1eb": "", "Image": "X\x1e"}) == {0, 1}
    assert index.candidates({"Image": "q\x1eImage\x1f\\AB"}) == {2}
    assert index.candidates({"x\x1f": "\x1f\x1e", "Image": "\x1e"}) == {3}
    assert index.candidates({"Image": "aB\x1f\x1eC\\ab", "image": "aaa"}) == {2, 4, 5}
    assert index.candidates({"Image": "\x1eImage\x1fx\x1e", "a\x1eb": "x"}) == set()


def test_case_folding_that_changes_length_or_maps_onto_ascii_hides_no_key():
    rules = [
        frozenset({("Image", "endswith", "i\u0307x")}),  # 'İX'.lower()
        frozenset({("Image", "eq", "key")}),  # the Kelvin sign folds to 'k'
        frozenset({("Image", "startswith", "ß")}),
        frozenset({("Image", "contains", "\u03c2")}),  # final sigma: capital sigma at an end
    ]
    index = LiteralIndex(rules)
    assert index.candidates({"Image": "aİX"}) == {0}
    assert index.candidates({"Image": "\u212aEY"}) == {1}
    assert index.candidates({"Image": "ßİX"}) == {0, 2}
    assert index.candidates({"Image": ["\u0391\u03a3", "\ud800"]}) == {3}
    assert index.candidates({"Image": "\u0391\u03a3A"}) == set()  # not at an end: sigma


@pytest.mark.parametrize("shared", [1, 2, 1000])
def test_long_literals_found_through_their_prefix_are_exactly_as_shown(monkeypatch, shared):
    """A literal longer than PREFIX_MAX is in the automaton as its prefix and checked whole
    where that is found (unless more than PREFIX_SHARED_MAX share it): with a prefix of 2
    characters the random keys above share prefixes with each other and with shorter
    literals all the time."""
    monkeypatch.setattr(literal_index, "PREFIX_MAX", 2)
    monkeypatch.setattr(literal_index, "PREFIX_SHARED_MAX", shared)
    monkeypatch.setattr(literal_index, "FEW_LITERALS", 0)  # every field on the automaton
    check_random_indexes(20261202)


def test_hashes_sharing_a_prefix_are_told_apart():
    prefix = literal_index.PREFIX_MAX
    md5 = "md5=" + "0123456789abcdef" * 2
    rules = [
        frozenset({("Hashes", "contains", md5)}),
        frozenset({("Hashes", "contains", md5[:-1] + "0")}),  # the same first 35 characters
        frozenset({("Hashes", "contains", md5[:prefix])}),  # a literal that is the prefix itself
        frozenset({("Hashes", "startswith", md5)}),
        frozenset({("Hashes", "endswith", md5)}),
        *(frozenset({("Hashes", "contains", f"sha1={n:040x}")}) for n in range(40)),
    ]
    index = LiteralIndex(rules)
    assert index.candidates({"Hashes": md5.upper()}) == {0, 2, 3, 4}
    assert index.candidates({"Hashes": "SHA1=1," + md5[:-1] + "0,x"}) == {1, 2}
    assert index.candidates({"Hashes": md5[:prefix] + md5}) == {0, 2, 4}  # the prefix twice
    assert index.candidates({"Hashes": md5[:-1]}) == {2}  # cut short at the end
    assert index.candidates({"Hashes": f"x,sha1={39:040x}"}) == {5 + 39}
