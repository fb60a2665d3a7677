"""Differential test: our engine against the pySigma SQLite backend's SQL run on sqlite3.

Random rules cover every modifier family the SQLite backend supports; random events are stored
in a table with one column per field (COLLATE NOCASE, the way Zircolite builds it). For every
rule, the set of matching event ids must be the same.

Deliberate differences, kept out of the generated cases (and tested on their own in
test_engine_semantics.py):
- numbers vs strings: the table keeps the event's type, and SQLite never finds the text '5'
  equal to the integer 5 nor compares text numerically; our engine does both. Numeric rule
  values go to numeric fields only, string values to string fields only.
- case folding: SQLite's NOCASE and LIKE fold ASCII only; our engine folds Unicode. Values are
  ASCII (windash's dashes and the wide encodings have no case).
- IPv6 CIDR: the backend turns a network into textual prefixes of the compressed form, which
  miss addresses written differently; our engine compares addresses. IPv4 only here.
- CIDR prefixes off an octet boundary: the backend expands them into several LIKE patterns
  and emits that OR without parentheses inside an AND (`x AND ip LIKE 'a.%' OR ip LIKE
  'b.%' ...`), so it matches more than the rule says. Octet-aligned prefixes only here.
- `|week`: SQLite's %W counts weeks from the first Monday; our engine uses ISO 8601 weeks.
- keywords (field-less values) and list-valued fields have no SQL form in this backend.
- placeholders with no value: pySigma stops; our engine matches nothing for them, with a
  warning. Generated rules have no placeholders.
- keywords skip the fields hpcsec adds (`hpcsec.*`, enrichment); not generated here either.
- `|wide`/`|utf16*`: the backend puts the NUL bytes of the encoding into the SQL text, which
  sqlite3 refuses to run ("the query contains a null character").
"""

from __future__ import annotations

import base64
import random
import re
import sqlite3
from typing import Any

from sigma.backends.sqlite import sqliteBackend
from sigma.collection import SigmaCollection

from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

SEED = 20261201
RULES = 300
EVENTS = 500
WORDS = [
    "alpha",
    "Beta",
    "gamma",
    "50%off",
    "a_b",
    "back\\slash",
    "x-ray",
    "x/ray",
    "EPS",
    "nvidia-smi",
    "it's",
]
STRING_FIELDS = ["s.one", "s.two", "s.three"]
NUMBER_FIELDS = ["n.one", "n.two"]
TIME = "t.stamp"
IP = "ip.addr"
FLAG = "b.flag"


def random_text(rng: random.Random) -> str:
    parts = rng.sample(WORDS, rng.randint(1, 3))
    separator = rng.choice([" ", "", " -", " /", "\u2013"])
    return separator.join(p.upper() if rng.random() < 0.2 else p for p in parts)


def encoded(rng: random.Random, text: str) -> str:
    """Events sometimes carry encoded forms, so the encoding modifiers can match."""
    if rng.random() < 0.5:
        return base64.b64encode(text.encode()).decode()
    return "xx" + base64.b64encode(b"q " + text.encode()).decode()


def random_event(rng: random.Random) -> dict[str, Any]:
    event: dict[str, Any] = {"event.category": "process"}
    for field in STRING_FIELDS:
        roll = rng.random()
        if roll < 0.15:
            continue  # absent
        if roll < 0.2:
            event[field] = None
        elif roll < 0.35:
            event[field] = encoded(rng, rng.choice(WORDS))
        else:
            event[field] = random_text(rng)
    for field in NUMBER_FIELDS:
        if rng.random() < 0.85:
            event[field] = rng.randint(-3, 12)
    if rng.random() < 0.9:
        event[TIME] = (
            f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z"
        )
    if rng.random() < 0.9:
        event[IP] = f"10.{rng.choice([0, 1, 64, 200])}.{rng.randint(0, 255)}.{rng.randint(0, 255)}"
    if rng.random() < 0.8:
        event[FLAG] = rng.random() < 0.5
    return event


def quote(text: str) -> str:
    """A word as a literal Sigma string: escape the wildcard characters and backslashes."""
    return re.sub(r"([*?\\])", r"\\\1", text)


def random_item(rng: random.Random) -> tuple[str, Any]:
    """One detection item: (field|modifiers, value) from one modifier family."""
    field = rng.choice(STRING_FIELDS)
    word = rng.choice(WORDS)
    family = rng.choice(
        [
            "eq",
            "wildcard",
            "contains",
            "startswith",
            "endswith",
            "all",
            "re",
            "cidr",
            "exists",
            "compare",
            "neq",
            "base64",
            "base64offset",
            "windash",
            "fieldref",
            "cased",
            "null",
            "bool",
            "number",
            "time",
            "list",
        ]
    )
    if family == "eq":
        return field, quote(random_text(rng))
    if family == "wildcard":
        text = quote(word)
        cut = rng.randrange(len(text) + 1)
        return field, text[:cut] + rng.choice(["*", "?"]) + text[cut:]
    if family in ("contains", "startswith", "endswith"):
        return f"{field}|{family}", quote(word[: rng.randint(1, len(word))])
    if family == "all":
        return f"{field}|contains|all", [quote(w) for w in rng.sample(WORDS, 2)]
    if family == "re":
        flags = "".join(f"|{f}" for f in ("i", "m", "s") if rng.random() < 0.4)
        return f"{field}|re{flags}", rng.choice(
            ["^al", "ta$", "x.ray", "[0-9]+%", "(?:EPS|Beta)", "a_b|gam+a", "^x"]
        )
    if family == "cidr":
        return f"{IP}|cidr", rng.choice(
            ["10.0.0.0/8", "10.1.0.0/16", "10.64.0.0/16", "10.1.7.0/24", "10.0.3.5/32"]
        )
    if family == "exists":
        return f"{rng.choice(STRING_FIELDS + NUMBER_FIELDS)}|exists", rng.random() < 0.5
    if family == "compare":
        return f"{rng.choice(NUMBER_FIELDS)}|{rng.choice(['gt', 'gte', 'lt', 'lte'])}", rng.randint(
            -2, 10
        )
    if family == "neq":
        return f"{field}|neq", quote(random_text(rng))
    if family in ("base64", "base64offset"):
        modifier = "base64" if family == "base64" else "base64offset|contains"
        return f"{field}|{modifier}", word
    if family == "windash":
        return f"{field}|windash|contains", rng.choice([" -", "-ray", " /x"])
    if family == "fieldref":
        other = rng.choice([f for f in STRING_FIELDS if f != field])
        how = rng.choice(["", "|startswith", "|endswith", "|contains"])
        return f"{field}|fieldref{how}", other
    if family == "cased":
        return f"{field}|cased{rng.choice(['', '|contains', '|startswith'])}", quote(word)
    if family == "null":
        return rng.choice(STRING_FIELDS + NUMBER_FIELDS), None
    if family == "bool":
        return FLAG, rng.random() < 0.5
    if family == "number":
        return rng.choice(NUMBER_FIELDS), rng.randint(-3, 12)
    if family == "time":
        part, top = rng.choice(
            [("minute", 59), ("hour", 23), ("day", 28), ("month", 12), ("year", 2026)]
        )
        compare = rng.choice(["", "", "|gt", "|gte", "|lt", "|lte"])
        return f"{TIME}|{part}{compare}", rng.randint(
            max(0, top - 24), top
        ) if part != "year" else 2026
    return field, [quote(random_text(rng)) for _ in range(3)] + [quote(word)]


CONDITIONS = [
    "sel1",
    "sel1 and not sel2",
    "sel1 or sel2",
    "1 of sel*",
    "all of them",
    "(sel1 or sel2) and not sel3",
    "not sel1",
    "sel1 and sel2 or sel3",
    "1 of them and not _aux",
]


def random_rule(rng: random.Random, n: int) -> dict[str, Any]:
    condition = rng.choice(CONDITIONS)
    names = ["sel1", "sel2", "sel3", "_aux"]
    detection: dict[str, Any] = {"condition": condition}
    for name in names:
        if rng.random() < 0.3:
            detection[name] = [dict([random_item(rng)]) for _ in range(rng.randint(1, 2))]
        else:
            detection[name] = dict(random_item(rng) for _ in range(rng.randint(1, 3)))
    return {
        "title": f"differential {n}",
        "id": f"00000000-0000-4000-9000-{n:012d}",
        "logsource": {"product": "hpc", "category": "process"},
        "detection": detection,
    }


def sqlite_ids(events: list[dict[str, Any]], queries: list[str]) -> list[set[int]]:
    fields = sorted({f for e in events for f in e} | set(STRING_FIELDS + NUMBER_FIELDS))
    db = sqlite3.connect(":memory:")
    db.create_function(
        "REGEXP",
        2,
        lambda pattern, value: value is not None and re.search(pattern, str(value)) is not None,
        deterministic=True,
    )
    db.execute("CREATE TABLE logs (" + ", ".join(f'"{f}" COLLATE NOCASE' for f in fields) + ")")
    db.executemany(
        f"INSERT INTO logs (rowid, {', '.join(repr(f) for f in fields)}) "
        f"VALUES (?, {', '.join('?' * len(fields))})",
        [(i, *(e.get(f) for f in fields)) for i, e in enumerate(events)],
    )
    return [
        {row[0] for row in db.execute(q.replace("SELECT *", "SELECT rowid", 1))} for q in queries
    ]


def test_engine_agrees_with_sqlite_backend():
    rng = random.Random(SEED)
    rules = [random_rule(rng, n) for n in range(RULES)]
    events = [random_event(rng) for _ in range(EVENTS)]
    collection = SigmaCollection.from_dicts(rules)
    backend = sqliteBackend()
    queries = [backend.convert_rule(rule)[0] for rule in collection.rules]
    expected = sqlite_ids(events, queries)

    items = SigmaCollection.from_dicts(rules)
    engine = Engine(RuleSet([LoadedRule(r, "<differential>", 1, "test") for r in items]))
    got: list[set[int]] = [set() for _ in rules]
    index = {rule.id: n for n, rule in enumerate(engine.rules)}
    for i, event in enumerate(events):
        for match in engine.evaluate([event]):
            got[index[match.rule.id]].add(i)

    mismatches = [
        (
            n,
            rules[n]["detection"],
            [(i, i in got[n], events[i]) for i in sorted(expected[n] ^ got[n])[:2]],
        )
        for n in range(RULES)
        if expected[n] != got[n]
    ]
    assert not mismatches, "\n\n".join(map(str, mismatches[:3]))
    # the generated cases must exercise both outcomes, or the comparison proves nothing
    assert sum(1 for ids in got if ids) > RULES // 3
    assert sum(1 for ids in got if len(ids) < EVENTS) > RULES // 3
