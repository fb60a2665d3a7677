"""Where Sigma leaves room, the engine's choices (docs/rule-authoring.md, "Semantics where
Sigma leaves room"): one test per choice."""

from __future__ import annotations

import pytest

from hpcsec.detector.engine.evaluate import Engine
from tests.detector.test_engine_semantics import HEADER, check, ruleset


def test_keywords_search_what_was_observed_not_what_hpcsec_added():
    keywords = "keywords:\n  - xmrig\ncondition: keywords\n"
    keywords_rule = "detection:\n  " + keywords.replace("\n", "\n  ").rstrip() + "\n"
    check(
        keywords,
        [{"process.command_line": "/tmp/xmrig -o pool"}],
        [
            # site policy and the job context enrichment adds to a process
            {"process.name": "python3", "hpcsec.asset.name": "xmrig-weights"},
            {"process.name": "python3", "slurm.job.name": "xmrig-bench"},
            {"process.name": "python3", "slurm.node.users": ["xmrig"]},
            {"process.name": "python3", "firmware.baseline_version": "xmrig"},
            {"process.name": "python3", "event.id": "xmrig"},
        ],
    )
    # a slurm_job event observed its job itself: its slurm.* fields are searched
    rules = ruleset(HEADER.replace("category: process", "category: slurm_job") + keywords_rule)
    job = {"event.category": "slurm_job", "slurm.job.name": "xmrig-bench"}
    assert len(Engine(rules).evaluate([job])) == 1


def test_numbers_and_strings_compare_by_json_spelling():
    # a number in the rule matches numbers and numeric strings of the same value
    check(
        "sel:\n  process.pid: 42\ncondition: sel\n",
        [{"process.pid": 42}, {"process.pid": 42.0}, {"process.pid": "42"}, {"process.pid": "042"}],
        [{"process.pid": "42x"}, {"process.pid": True}],
    )
    # a string in the rule matches a number whose JSON spelling it is
    check(
        "sel:\n  process.pid: '42'\ncondition: sel\n",
        [{"process.pid": 42}, {"process.pid": "42"}],
        [{"process.pid": 42.0}, {"process.pid": "042"}, {"process.pid": 42.5}],
    )


def test_booleans_are_not_numbers():
    check(
        "sel:\n  user.is_admin: true\ncondition: sel\n",
        [{"user.is_admin": True}, {"user.is_admin": "true"}, {"user.is_admin": "TRUE"}],
        [{"user.is_admin": 1}, {"user.is_admin": "1"}, {"user.is_admin": False}],
    )
    check(
        "sel:\n  user.is_admin: 1\ncondition: sel\n",
        [{"user.is_admin": 1}],
        [{"user.is_admin": True}],
    )


def test_case_folding_is_unicode_lowercase_not_casefold():
    check(
        "sel:\n  user.name: ÄRGER\ncondition: sel\n",
        [{"user.name": "ärger"}, {"user.name": "Ärger"}],
        [{"user.name": "arger"}],
    )
    # full case folding would make ß and ss equal; lowercase keeps them apart
    check(
        "sel:\n  user.name: STRASSE\ncondition: sel\n",
        [{"user.name": "strasse"}],
        [{"user.name": "straße"}],
    )


@pytest.mark.parametrize(
    ("network", "inside", "outside"),
    [
        ("10.0.0.0/8", ["10.0.0.1", "::ffff:10.0.0.1", "::FFFF:10.0.0.1", "::ffff:a00:1"], []),
        ("10.0.0.0/8", [], ["::10.0.0.1", "64:ff9b::10.0.0.1", "::ffff:11.0.0.1"]),
        ("::ffff:10.0.0.0/104", ["::ffff:10.0.0.1"], ["10.0.0.1"]),
    ],
)
def test_cidr_reads_ipv4_mapped_addresses_as_ipv4(network, inside, outside):
    check(
        f"sel:\n  destination.ip|cidr: '{network}'\ncondition: sel\n",
        [{"destination.ip": ip} for ip in inside],
        [{"destination.ip": ip} for ip in outside],
    )
