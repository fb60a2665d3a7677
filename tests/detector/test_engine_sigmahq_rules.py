"""Real SigmaHQ regex and keyword rules (tests/data/sigmahq, DRL 1.1) through the literal
index: the indexed engine, the unindexed engine and the expected matches agree, and for the
rules with fields so does the pySigma SQLite backend's SQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sigma.backends.sqlite import sqliteBackend

from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from tests.detector.test_engine_differential import sqlite_ids

RULES = Path(__file__).resolve().parent.parent / "data" / "sigmahq"
CATEGORY = "sigmahq"
STDIN = "9c14c9fa-1a63-4a64-8e57-d19280559490"
PING = "1a0d4aba-7668-4365-9ce4-6d79ab088dfd"
CURL = "cb9cc1d1-e84e-4bdc-b7ad-c31b1b7908ec"
IPFS = "eb6c2004-1cef-427f-8885-9042974e5eb6"
PASSWD = "c67fc22a-0be5-4b4f-aad5-2b32c4b69523"
SNIFF = "b9e1f193-d236-4451-aaae-2f3d2102120d"
CASES: list[tuple[dict[str, Any], set[str]]] = [
    ({"CommandLine": 'cmd /c SET x=1&&set y=Invoke-Expression && echo "'}, {STDIN}),
    ({"CommandLine": 'cmd /c \u017fET x=1&&\u017fet ${input} && echo "'}, {STDIN}),  # RE2 folds
    ({"CommandLine": 'cmd /c set x=1 && echo "'}, set()),
    ({"Image": "C:\\Windows\\System32\\PING.EXE", "CommandLine": "ping 0x7F000001"}, {PING}),
    ({"Image": "C:\\Windows\\System32\\ping.exe", "CommandLine": "ping 0x7F00001"}, set()),
    ({"Image": "C:\\tools\\curl.exe", "CommandLine": "curl -k https://x"}, {CURL}),
    ({"OriginalFileName": "curl.exe", "CommandLine": "c --insecure x"}, {CURL}),
    ({"Image": "C:\\tools\\curl.exe", "CommandLine": "curl -kv https://x"}, set()),
    ({"cs-uri": "https://IPFS.io/ipfs/Qm.html#user@example.com"}, {IPFS}),
    ({"cs-uri": "https://ipfs.io/ipfs/Qm"}, set()),
    ({"message": "sudo LN -S /etc/passwd /tmp/p"}, {PASSWD}),
    ({"message": "ln -sf /etc/passwd /tmp/p"}, set()),
    ({"cmd": ["show run", "Monitor Capture Point ip cef x"]}, {SNIFF}),
    ({"hpcsec.note": "set span"}, set()),  # keywords skip what hpcsec adds
    ({"CommandLine": "set rspan 1", "Image": "C:\\x\\ping.exe"}, {SNIFF}),
]


def ruleset() -> Any:
    """The rules, routed to one category of product hpc (their own logsources are other
    products'), so that one literal index holds them all."""
    rules = load_rules([RULES], with_tests=False)
    rules.rules = [rule.rerouted("hpc", CATEGORY) for rule in rules.rules]
    return rules


def events() -> list[dict[str, Any]]:
    return [{"event.category": CATEGORY, **event} for event, _ in CASES]


def matched(engine: Engine) -> list[set[str]]:
    return [{m.rule.id for m in engine.evaluate([event])} for event in events()]


def test_sigmahq_rules_indexed_match_unindexed_and_expected():
    rules = ruleset()
    assert len(rules.rules) == 6
    indexed = matched(Engine(rules, index_min=1))
    assert indexed == matched(Engine(rules, index_min=10**6))
    assert indexed == [expected for _, expected in CASES]


def test_sigmahq_field_rules_agree_with_sqlite_backend():
    """Keywords and list values have no SQL form in the backend: the rules with fields are
    compared, on the events without lists."""
    rules = ruleset()
    backend = sqliteBackend()
    with_fields = [r for r in rules.rules if r.id not in (PASSWD, SNIFF)]
    queries = [backend.convert_rule(r.sigma)[0] for r in with_fields]
    flat = [{k: v for k, v in e.items() if not isinstance(v, list)} for e in events()]
    expected = sqlite_ids(flat, queries)
    got = matched(Engine(rules, index_min=1))
    for rule, ids in zip(with_fields, expected, strict=True):
        assert ids == {i for i, found in enumerate(got) if rule.id in found}, rule.id
        assert ids  # each rule matches some event
