"""Detection semantics, one by one, each with matching and non-matching events."""

from __future__ import annotations

import textwrap

import pytest
from sigma.collection import SigmaCollection

from hpcsec.detector.engine.evaluate import Engine, Match
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

HEADER = """\
title: semantics
id: 6b1c2f6e-0000-4000-8000-000000000001
status: test
level: high
logsource: {product: hpc, category: process}
"""


def ruleset(text: str, path: str = "rules/test.yml") -> RuleSet:
    # filters collected, not applied by pySigma: applying them is the engine's job
    collection = SigmaCollection.from_yaml(text, collect_filters=True)
    items = list(collection.rules) + [f for f in collection.filters if f not in collection.rules]
    return RuleSet([LoadedRule(item, path, 1, "test") for item in items])


def engine_for(detection: str, **kwargs) -> Engine:
    body = "detection:\n" + textwrap.indent(textwrap.dedent(detection), "  ")
    return Engine(ruleset(HEADER + body), **kwargs)


def fires(engine: Engine, **fields) -> bool:
    event = {"event.category": "process", **fields}
    return bool(engine.evaluate([event]))


def check(detection: str, matching: list[dict], nonmatching: list[dict], **kwargs) -> None:
    engine = engine_for(detection, **kwargs)
    for event in matching:
        assert fires(engine, **event), f"should match: {event}"
    for event in nonmatching:
        assert not fires(engine, **event), f"should not match: {event}"


def test_plain_value_is_case_insensitive_whole_string():
    check(
        "sel:\n  process.name: Python3\ncondition: sel\n",
        [{"process.name": "python3"}, {"process.name": "PYTHON3"}],
        [{"process.name": "python"}, {"process.name": "python3.11"}, {}, {"user.name": "x"}],
    )


def test_wildcards_star_and_question_mark():
    check(
        "sel:\n  process.name: 'py*n?'\ncondition: sel\n",
        [{"process.name": "python3"}, {"process.name": "PYn3"}, {"process.name": "pyXXXnz"}],
        [{"process.name": "python"}, {"process.name": "python33"}, {"process.name": "xpyn3"}],
    )


def test_escaped_wildcards_are_literal():
    check(
        "sel:\n  process.command_line: 'a\\*b\\?c'\ncondition: sel\n",
        [{"process.command_line": "a*b?c"}, {"process.command_line": "A*B?C"}],
        [{"process.command_line": "axxbyc"}, {"process.command_line": "a*bzc"}],
    )


def test_backslash_before_ordinary_character_is_kept():
    check(
        "sel:\n  process.executable: 'C:\\tools\\x.exe'\ncondition: sel\n",
        [{"process.executable": "c:\\tools\\x.exe"}],
        [{"process.executable": "C:toolsx.exe"}],
    )


def test_list_is_or():
    check(
        "sel:\n  process.name: [xmrig, minerd, ethminer]\ncondition: sel\n",
        [{"process.name": "xmrig"}, {"process.name": "EthMiner"}],
        [{"process.name": "python"}, {}],
    )


def test_map_is_and():
    check(
        "sel:\n  process.name: nc\n  user.name: bob\ncondition: sel\n",
        [{"process.name": "nc", "user.name": "bob"}],
        [{"process.name": "nc"}, {"user.name": "bob"}, {"process.name": "nc", "user.name": "x"}],
    )


def test_list_of_maps_is_or():
    check(
        "sel:\n  - process.name: nc\n  - user.name: bob\ncondition: sel\n",
        [{"process.name": "nc"}, {"user.name": "bob"}],
        [{"process.name": "ls"}],
    )


def test_null_matches_absent_or_none_only():
    check(
        "sel:\n  slurm.job.id: null\ncondition: sel\n",
        [{}, {"slurm.job.id": None}],
        [{"slurm.job.id": 42}, {"slurm.job.id": ""}],
    )


def test_numbers_match_numbers_and_numeric_strings():
    check(
        "sel:\n  process.pid: 42\ncondition: sel\n",
        [{"process.pid": 42}, {"process.pid": 42.0}, {"process.pid": "42"}],
        [{"process.pid": 43}, {"process.pid": "x42"}, {"process.pid": True}, {}],
    )


def test_booleans():
    check(
        "sel:\n  user.is_admin: false\ncondition: sel\n",
        [{"user.is_admin": False}, {"user.is_admin": "false"}],
        [{"user.is_admin": True}, {"user.is_admin": 0}, {}],
    )


def test_event_lists_match_any_element():
    check(
        "sel:\n  slurm.job.gpus: 3\ncondition: sel\n",
        [{"slurm.job.gpus": [0, 3]}, {"slurm.job.gpus": ["3"]}],
        [{"slurm.job.gpus": [0, 1]}, {"slurm.job.gpus": []}],
    )


@pytest.mark.parametrize(
    ("modifier", "value", "yes", "no"),
    [
        ("contains", "nvidia-smi", "/usr/bin/NVIDIA-SMI -q", "/usr/bin/nvidia"),
        ("startswith", "/lustre/", "/LUSTRE/models/x", "/scratch/lustre/x"),
        ("endswith", ".safetensors", "/m/model.SafeTensors", "/m/model.safetensors.bak"),
        ("contains|cased", "Secret", "a Secret b", "a secret b"),
    ],
)
def test_string_modifiers(modifier, value, yes, no):
    check(
        f"sel:\n  file.path|{modifier}: '{value}'\ncondition: sel\n",
        [{"file.path": yes}],
        [{"file.path": no}, {}],
    )


def test_cased_exact():
    check(
        "sel:\n  process.name|cased: Xmrig\ncondition: sel\n",
        [{"process.name": "Xmrig"}],
        [{"process.name": "xmrig"}],
    )


def test_contains_all():
    check(
        "sel:\n  process.command_line|contains|all: [--rkey, ib_write]\ncondition: sel\n",
        [{"process.command_line": "IB_WRITE_bw --rkey 5"}],
        [{"process.command_line": "ib_write_bw"}, {"process.command_line": "--rkey"}],
    )


def test_regex_case_sensitive_by_default_and_flags():
    check(
        "sel:\n  process.name|re: '^x[mn]rig$'\ncondition: sel\n",
        [{"process.name": "xmrig"}],
        [{"process.name": "XMRIG"}, {"process.name": "axmrig"}],
    )
    check(
        "sel:\n  process.name|re|i: '^x[mn]rig$'\ncondition: sel\n",
        [{"process.name": "XMRIG"}],
        [{"process.name": "XMRIGS"}],
    )
    check(
        "sel:\n  message|re|m: '^fail$'\ncondition: sel\n",
        [{"message": "ok\nfail\nok"}],
        [{"message": "ok fail"}],
    )
    check(
        "sel:\n  message|re|s: 'a.b'\ncondition: sel\n", [{"message": "a\nb"}], [{"message": "ab"}]
    )
    check(
        "sel:\n  message|re: 'a.b'\ncondition: sel\n", [{"message": "xa-bx"}], [{"message": "a\nb"}]
    )


@pytest.mark.parametrize(
    ("cidr", "inside", "outside"),
    [
        ("10.1.0.0/16", ["10.1.255.3"], ["10.2.0.1", "fe80::1", "not-an-ip"]),
        ("10.0.0.0/9", ["10.127.0.1"], ["10.128.0.1"]),
        ("192.168.1.64/27", ["192.168.1.64", "192.168.1.95"], ["192.168.1.96", "192.168.1.63"]),
        ("10.0.0.5/32", ["10.0.0.5"], ["10.0.0.50"]),
        ("fe80::/10", ["fe80::1", "febf::1"], ["fec0::1", "10.0.0.1"]),
        ("2001:db8:abcc::/47", ["2001:db8:abcd:1::1"], ["2001:db8:abce::1"]),
        ("10.0.0.0/8", ["::ffff:10.2.3.4"], ["::ffff:11.2.3.4"]),
    ],
)
def test_cidr_any_prefix(cidr, inside, outside):
    check(
        f"sel:\n  source.ip|cidr: '{cidr}'\ncondition: sel\n",
        [{"source.ip": ip} for ip in inside],
        [{"source.ip": ip} for ip in outside] + [{}],
    )


def test_exists():
    check(
        "sel:\n  process.env.LD_PRELOAD|exists: true\ncondition: sel\n",
        [{"process.env.LD_PRELOAD": ""}],
        [{}, {"process.env.LD_PRELOAD": None}],
    )
    check(
        "sel:\n  process.env.LD_PRELOAD|exists: false\ncondition: sel\n",
        [{}],
        [{"process.env.LD_PRELOAD": "/x.so"}],
    )


@pytest.mark.parametrize(
    ("modifier", "yes", "no"),
    [
        ("gt", [11, "10.5"], [10, 9, "x", None]),
        ("gte", [10, 10.0], [9.99]),
        ("lt", [9, -1], [10, 11]),
        ("lte", [10, "3"], [10.01]),
    ],
)
def test_numeric_comparisons(modifier, yes, no):
    check(
        f"sel:\n  rdma.port_xmit_data_rate|{modifier}: 10\ncondition: sel\n",
        [{"rdma.port_xmit_data_rate": v} for v in yes],
        [{"rdma.port_xmit_data_rate": v} for v in no],
    )


def test_neq_negates_the_item():
    check(
        "sel:\n  event.action: open\n  user.name|neq: root\ncondition: sel\n",
        [{"event.action": "open", "user.name": "bob"}, {"event.action": "open"}],
        [{"event.action": "open", "user.name": "ROOT"}],
    )


def test_base64_and_base64offset():
    check(
        "sel:\n  process.command_line|base64: 'curl '\ncondition: sel\n",
        [{"process.command_line": "Y3VybCA="}],
        [{"process.command_line": "curl "}],
    )
    # base64offset values are substrings of the encoding at any of three alignments
    check(
        "sel:\n  process.command_line|base64offset|contains: 'nvidia-smi'\ncondition: sel\n",
        [
            {"process.command_line": "echo bnZpZGlhLXNtaQ== | base64 -d"},
            {"process.command_line": "eCBudmlkaWEtc21p"},  # b64("x nvidia-smi")
            {"process.command_line": "eHggbnZpZGlhLXNtaQ"},
        ],  # b64("xx nvidia-smi")
        [{"process.command_line": "nvidia-smi"}],
    )


def test_windash():
    check(
        "sel:\n  process.command_line|windash|contains: ' -force'\ncondition: sel\n",
        [
            {"process.command_line": "x -force"},
            {"process.command_line": "x /force"},
            {"process.command_line": "x \u2013force"},
        ],
        [{"process.command_line": "x force"}],
    )


@pytest.mark.parametrize(
    ("modifier", "encoded"),
    [
        ("wide", "p\x00w\x00"),  # pySigma spells UTF-16LE `wide` (it has no `utf16le`)
        ("utf16be", "\x00p\x00w"),
        ("utf16", "\ufeffp\x00w\x00"),
    ],
)
def test_wide_encodings(modifier, encoded):
    check(
        f"sel:\n  message|{modifier}|contains: pw\ncondition: sel\n",
        [{"message": "x" + encoded + "y"}],
        [{"message": "pw"}],
    )


def test_fieldref():
    check(
        "sel:\n  user.name|fieldref: slurm.job.user\ncondition: sel\n",
        [{"user.name": "Bob", "slurm.job.user": "bob"}],
        [{"user.name": "bob", "slurm.job.user": "eve"}, {"user.name": "bob"}, {}],
    )
    check(
        "sel:\n  file.path|fieldref|startswith: hpcsec.home\ncondition: sel\n",
        [{"file.path": "/home/bob/x", "hpcsec.home": "/home/bob"}],
        [{"file.path": "/home/eve/x", "hpcsec.home": "/home/bob"}],
    )


def test_expand_placeholders_from_site_values():
    detection = "sel:\n  user.name|expand: '%admins%'\ncondition: sel\n"
    check(
        detection,
        [{"user.name": "adm-carol"}, {"user.name": "ROOT"}],
        [{"user.name": "bob"}],
        placeholders={"admins": ["adm-carol", "root"]},
    )


def test_a_placeholder_without_value_loads_with_a_warning_and_matches_nothing(caplog):
    detection = "sel:\n  user.name|expand:\n    - '%admins%'\n    - carol\ncondition: sel\n"
    for values in ({}, {"admins": []}):  # not in the config, or an empty list
        caplog.clear()
        engine = engine_for(detection, placeholders=values)
        assert caplog.messages == [
            "rules/test.yml:1: rule 6b1c2f6e-0000-4000-8000-000000000001: placeholder %admins% "
            "has no value (placeholder values come from the site config): its values match "
            "nothing"
        ]
        assert not fires(engine, **{"user.name": "%admins%"})
        assert not fires(engine, **{"user.name": "adm-carol"})
        assert fires(engine, **{"user.name": "carol"})  # the rule's other values still work


@pytest.mark.parametrize(
    ("modifier", "number", "yes", "no"),
    [
        ("hour", 3, "2026-12-01T03:59:00Z", "2026-12-01T04:00:00Z"),
        ("minute", 7, "2026-12-01T03:07:30Z", "2026-12-01T03:08:00Z"),
        ("day", 1, "2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"),
        ("week", 49, "2026-12-01T00:00:00Z", "2026-12-08T00:00:00Z"),
        ("month", 12, "2026-12-31T23:00:00+00:00", "2027-01-01T00:00:00Z"),
        ("year", 2026, "2026-06-01T00:00:00Z", "2025-06-01T00:00:00Z"),
    ],
)
def test_time_part_modifiers(modifier, number, yes, no):
    check(
        f"sel:\n  process.start|{modifier}: {number}\ncondition: sel\n",
        [{"process.start": yes}],
        [{"process.start": no}, {"process.start": "garbage"}, {}],
    )


def test_keywords_search_every_string_value():
    check(
        "keywords:\n  - 'stratum+tcp'\n  - 'xmr*pool'\ncondition: keywords\n",
        [
            {"process.command_line": "x -o STRATUM+TCP://p:3333"},
            {"message": "a xmr.pool b"},
            {"process.args": ["-o", "stratum+tcp://x"]},
        ],
        [{"process.command_line": "stratum tcp"}, {"process.pid": 5}],
    )


def test_conditions_and_or_not_parentheses():
    check(
        """\
a:
  process.name: a
b:
  user.name: b
c:
  host.name: c
condition: (a or b) and not c
""",
        [{"process.name": "a"}, {"user.name": "b", "host.name": "d"}],
        [{"process.name": "a", "host.name": "c"}, {"host.name": "c"}, {}],
    )


def test_one_of_all_of_them_patterns_and_underscore():
    detection = """\
sel_a:
  process.name: a
sel_b:
  user.name: b
_helper:
  host.name: h
condition: {}
"""
    check(detection.format("1 of sel_*"), [{"process.name": "a"}, {"user.name": "b"}], [{}])
    check(
        detection.format("all of sel_*"),
        [{"process.name": "a", "user.name": "b"}],
        [{"process.name": "a"}],
    )
    # `_`-prefixed identifiers are not part of `them`
    check(
        detection.format("all of them"),
        [{"process.name": "a", "user.name": "b"}],
        [{"process.name": "a", "host.name": "h"}],
    )
    check(
        detection.format("1 of them and _helper"),
        [{"process.name": "a", "host.name": "h"}],
        [{"host.name": "h"}],
    )


def test_routing_by_category_and_product():
    engine = Engine(ruleset(HEADER + "detection:\n  sel:\n    process.name: a\n  condition: sel\n"))
    assert engine.evaluate([{"event.category": "file_access", "process.name": "a"}]) == []
    assert len(engine.evaluate([{"event.category": "process", "process.name": "a"}])) == 1
    other = Engine(
        ruleset(
            HEADER.replace("product: hpc", "product: windows")
            + "detection:\n  sel:\n    process.name: a\n  condition: sel\n"
        )
    )
    assert other.rules == []
    assert other.evaluate([{"event.category": "process", "process.name": "a"}]) == []


def test_match_carries_rule_and_event():
    engine = engine_for("sel:\n  process.name: a\ncondition: sel\n")
    event = {"event.category": "process", "process.name": "a"}
    (match,) = engine.evaluate([event])
    assert isinstance(match, Match)
    assert match.rule.id == "6b1c2f6e-0000-4000-8000-000000000001"
    assert match.events == (event,)
    assert (match.group, match.window_start, match.value) == ((), None, None)
    assert engine.flush() == []


FILTERED = (
    HEADER
    + """\
name: gpu_tool
detection:
  sel:
    process.name: nvidia-smi
  condition: sel
---
title: other
id: 6b1c2f6e-0000-4000-8000-000000000002
logsource: {product: hpc, category: process}
detection:
  sel:
    process.name: nvidia-smi
  condition: sel
---
title: admins may
id: 6b1c2f6e-0000-4000-8000-0000000000f1
logsource: {product: hpc, category: process}
filter:
  rules: [gpu_tool]
  admin:
    user.is_admin: true
  condition: not admin
"""
)


def test_filters_apply_to_named_rules_only():
    engine = Engine(ruleset(FILTERED))
    admin = {"event.category": "process", "process.name": "nvidia-smi", "user.is_admin": True}
    user = {**admin, "user.is_admin": False}
    assert [m.rule.id for m in engine.evaluate([admin])] == ["6b1c2f6e-0000-4000-8000-000000000002"]
    assert sorted(m.rule.id for m in engine.evaluate([user])) == [
        "6b1c2f6e-0000-4000-8000-000000000001",
        "6b1c2f6e-0000-4000-8000-000000000002",
    ]
    any_rule = FILTERED.replace("rules: [gpu_tool]", "rules: any")
    assert Engine(ruleset(any_rule)).evaluate([admin]) == []


def test_malformed_events_do_not_crash():
    engine = engine_for("sel:\n  process.name: a\ncondition: sel\n")
    odd = [
        {"event.category": ["process"]},
        {"event.category": None},
        {"event.category": "process", "process.name": {"nested": "a"}},
        {"event.category": "process", "process.name": [["a"]]},
    ]
    assert engine.evaluate(odd) == []


def test_filter_placeholders_are_filled():
    text = FILTERED.replace("    user.is_admin: true\n", "    user.name|expand: '%admins%'\n")
    engine = Engine(ruleset(text), placeholders={"admins": ["adm-carol"]})
    event = {"event.category": "process", "process.name": "nvidia-smi", "user.name": "adm-carol"}
    assert [m.rule.id for m in engine.evaluate([event])] == ["6b1c2f6e-0000-4000-8000-000000000002"]
    # without a value the filter's item matches nobody: `not admin` holds, it filters nothing
    assert len(Engine(ruleset(text)).evaluate([event])) == 2


def test_time_part_with_comparison():
    check(
        "sel:\n  process.start|hour|gte: 20\ncondition: sel\n",
        [{"process.start": "2026-12-01T21:00:00Z"}, {"process.start": "2026-12-01T20:00:00Z"}],
        [{"process.start": "2026-12-01T03:00:00Z"}, {"process.start": 20}],
    )


def test_value_lists_of_prefixes_suffixes_and_numbers():
    """Value lists are compiled to one set lookup or one tuple prefix/suffix test: the value
    semantics (case, lists in events, numeric strings, booleans) must stay those of each value."""
    check(
        "sel:\n  process.executable|startswith: [/usr/, /OPT/]\n"
        "  process.command_line|endswith: [.py, ' --x']\n  process.pid: [10, 20.5]\n"
        "condition: sel\n",
        [
            {"process.executable": "/Opt/a", "process.command_line": "RUN.PY", "process.pid": 10},
            {
                "process.executable": ["/bin/a", "/usr/b"],
                "process.command_line": "a --X",
                "process.pid": "20.5",
            },
            {
                "process.executable": "/usr/a",
                "process.command_line": ["x", "y.py"],
                "process.pid": [1, 10.0],
            },
        ],
        [
            {"process.executable": "/bin/usr/", "process.command_line": "a.py", "process.pid": 10},
            {"process.executable": "/usr/a", "process.command_line": "a.pyc", "process.pid": 10},
            {"process.executable": "/usr/a", "process.command_line": "a.py", "process.pid": True},
            {"process.executable": "/usr/a", "process.command_line": "a.py", "process.pid": "x"},
            {"process.executable": "/usr/a", "process.command_line": "a.py", "process.pid": 11},
            {"process.executable": "/usr/a", "process.command_line": "a.py"},
        ],
    )


def test_either_branch_of_an_or_matches():
    """Rules are tested first on a condition they cannot match without (for an OR, any
    branch's first test): an event matching through the second branch only still matches."""
    check(
        "a:\n  process.name: x\nb:\n  user.name: root\nc:\n  process.pid: 7\n"
        "d:\n  user.id: 0\ncondition: (a and not b) or (c and d)\n",
        [
            {"process.name": "x"},
            {"process.name": "X", "user.name": "alice"},
            {"process.pid": 7, "user.id": 0},
            {"process.name": "x", "process.pid": "7", "user.id": "0", "user.name": "root"},
        ],
        [
            {"process.name": "x", "user.name": "root"},
            {"process.pid": 7},
            {"user.id": 0},
            {"process.name": "y", "process.pid": 8, "user.id": 0},
            {},
        ],
    )
