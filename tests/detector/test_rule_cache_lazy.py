"""Lazy rules (ruleset.LoadedRule, rulecache.py): a cached load reads rule headers only, each
rule's pySigma object is unpickled on first use, and the short commands never import
pySigma's parser with a warm cache. Checked by behaviour (modules imported, objects loaded),
never by time."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hpcsec.detector.core.errors import RuleError
from hpcsec.detector.engine import rulecache
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

REPO = Path(__file__).resolve().parents[2]

RULES = """title: one
id: 0c0c0c0c-0000-4000-8000-0000000000a1
logsource: {product: hpc, category: process}
level: high
tags: [attack.t1496]
detection:
  sel:
    process.name: xmrig
  condition: sel
---
title: two
id: 0c0c0c0c-0000-4000-8000-0000000000a2
logsource: {product: hpc, category: network}
detection:
  sel:
    network.destination.port: 3333
  condition: sel
---
title: three
id: 0c0c0c0c-0000-4000-8000-0000000000a3
logsource: {product: hpc, category: process}
detection:
  sel:
    process.name: ncat
  condition: sel
"""

EVENTS = [
    {"event.category": "process", "process.name": "xmrig", "@timestamp": "2026-01-01T00:00:00Z"},
    {"event.category": "process", "process.name": "ncat", "@timestamp": "2026-01-01T00:00:01Z"},
    {"event.category": "network", "network.destination.port": 3333},
    {"event.category": "file", "file.path": "/etc/passwd"},
]


def run_python(code: str, cache: Path) -> dict:
    """`code` in a fresh interpreter (nothing imported yet); it prints one JSON object."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def matched(engine: Engine) -> list[str]:
    return sorted(m.rule.id for m in engine.evaluate(EVENTS) + engine.flush())


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yml"
    path.write_text(RULES)
    return path


def test_a_cached_load_reads_headers_only_and_imports_no_pysigma(tmp_path):
    cache = tmp_path / "hpcsec"
    cold = load_rules(None, with_tests=False, cache=cache)
    code = f"""
import json, sys
from pathlib import Path
from hpcsec.detector.engine.loader import load_rules
rules = load_rules(None, with_tests=False, cache=Path({str(cache)!r})).rules
print(json.dumps({{
    "pysigma": sorted(m for m in sys.modules if m == "sigma" or m.startswith("sigma.")),
    "loaded": sum(r.sigma_loaded for r in rules),
    "headers": [[r.id, r.title, r.kind, r.header.category, r.path, r.line] for r in rules],
}}))
"""
    seen = run_python(code, tmp_path)
    assert seen["pysigma"] == [] and seen["loaded"] == 0
    assert seen["headers"] == [
        [r.id, r.title, r.kind, r.header.category, r.path, r.line] for r in cold.rules
    ]


def test_a_cached_rule_reads_its_pysigma_object_on_first_use_equal_to_the_parsed_one(
    tmp_path, rules_file
):
    cache = tmp_path / "hpcsec"
    cold = load_rules([rules_file], with_tests=False, cache=cache)
    cached = load_rules([rules_file], with_tests=False, cache=cache)
    assert not any(r.sigma_loaded for r in cached.rules)
    first = cached.rules[0]
    assert first.line_of("detection", "sel") == cold.rules[0].line_of("detection", "sel") == 7
    assert first.sigma_loaded and not cached.rules[1].sigma_loaded
    assert first.sigma is first.sigma  # one object, whoever reads it
    assert cached.rules == cold.rules  # headers, sources and pySigma objects alike
    sent = pickle.loads(pickle.dumps(cached.rules[2]))  # e.g. to a worker process
    assert not sent.sigma_loaded and sent == cold.rules[2]
    assert pickle.loads(pickle.dumps(cold.rules[2])) == cold.rules[2]


def test_the_short_commands_import_no_pysigma_with_a_warm_cache(tmp_path, rules_file):
    config = REPO / "examples" / "site-config.yml"
    code = f"""
import contextlib, io, json, sys
from hpcsec.detector.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    codes = [main(["rules", "list", "--format", "json", {str(rules_file)!r}]),
             main(["config", "check", {str(config)!r}])]
print(json.dumps({{"codes": codes, "out": out.getvalue(),
    "pysigma": sorted(m for m in sys.modules if m == "sigma" or m.startswith("sigma."))}}))
"""
    cold = run_python(code, tmp_path)  # parses the rules, writes the cache
    assert cold["pysigma"] and cold["codes"] == [0, 0]
    warm = run_python(code, tmp_path)
    assert warm["pysigma"] == [] and warm["codes"] == [0, 0]
    assert warm["out"] == cold["out"]  # the same listing, from the headers
    listed = json.loads(warm["out"][: warm["out"].rindex("]") + 1])
    assert listed[0]["level"] == "high" and listed[0]["techniques"][0]["id"] == "T1496"


def test_config_check_finds_a_misspelled_list_from_cached_headers(tmp_path):
    from hpcsec.detector.config.site import load_config
    from hpcsec.detector.engine.config_names import config_name_errors

    config = tmp_path / "site.yml"
    config.write_text("lists:\n  admin: [root]\nthresholds:\n  gpu_idle_minute: 5\n")
    site = load_config(str(config))
    cache = tmp_path / "hpcsec"
    cold = load_rules(None, with_tests=False, cache=cache)
    cached = load_rules(None, with_tests=False, cache=cache)
    assert not any(r.sigma_loaded for r in cached.rules)
    messages = [str(e) for e in config_name_errors(site, cached.rules)]
    assert messages == [str(e) for e in config_name_errors(site, cold.rules)]
    assert any("lists.admin is not used" in m for m in messages)
    assert not any(r.sigma_loaded for r in cached.rules)


def test_a_damaged_entry_fails_its_checksum_and_is_rebuilt(tmp_path, rules_file):
    cache = tmp_path / "hpcsec"
    load_rules([rules_file], with_tests=False, cache=cache)
    (pack,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    data = bytearray(pack.read_bytes())
    at = data.index(b"xmrig")  # inside a rule's pickled object, past the headers
    data[at : at + 5] = b"xmrog"
    pack.write_bytes(bytes(data))
    (entry,) = rulecache.read(cache, [rules_file]).values()
    assert entry is None  # the pack's index holds, the entry's checksum no longer does
    again = load_rules([rules_file], with_tests=False, cache=cache)
    assert matched(Engine(again)) == sorted(r.id for r in again.rules)  # xmrig fires again
    assert b"xmrig" in pack.read_bytes() and b"xmrog" not in pack.read_bytes()  # rewritten


def forged(ruleset: RuleSet, broken: int) -> RuleSet:
    """The rule set as an entry whose checksum holds but one rule's object cannot be read."""
    rules = [
        LoadedRule.cached(
            r.header, b"not a pickle" if i == broken else r.blob(), r.path, r.line, r.vector, ""
        )
        for i, r in enumerate(ruleset.rules)
    ]
    decoded = rulecache.decode(rulecache.encode(RuleSet(rules)))
    assert decoded is not None
    return decoded


def test_an_unreadable_rule_object_is_a_rule_error_eagerly_and_skipped_lazily(rules_file, caplog):
    cold = load_rules([rules_file], with_tests=False)
    with pytest.raises(RuleError) as raised:
        Engine(forged(cold, 0))
    assert f"{rules_file}:1" in str(raised.value) and "rule cache" in str(raised.value)
    lazy = Engine(forged(cold, 0), lazy=True)
    with caplog.at_level(logging.ERROR):
        found = matched(lazy)
    # the other rule of its category still runs; the broken one is named with its line
    assert found == ["0c0c0c0c-0000-4000-8000-0000000000a2", "0c0c0c0c-0000-4000-8000-0000000000a3"]
    assert f"{rules_file}:1" in caplog.text and "not evaluated" in caplog.text


def test_a_lazy_engine_builds_a_category_at_its_first_event_and_matches_like_an_eager_one(
    tmp_path, rules_file
):
    cache = tmp_path / "hpcsec"
    cold = load_rules([rules_file], with_tests=False, cache=cache)
    cached = load_rules([rules_file], with_tests=False, cache=cache)
    lazy = Engine(cached, lazy=True)
    assert lazy.built_categories == set()
    assert not any(r.sigma_loaded for r in cached.rules)
    assert [m.rule.id for m in lazy.evaluate(EVENTS[2:3])] == [cached.rules[1].id]
    assert lazy.built_categories == {"network"}
    lazy.evaluate(EVENTS[3:])  # a category without rules builds nothing
    assert lazy.built_categories == {"network"}
    eager = Engine(load_rules([rules_file], with_tests=False))
    assert eager.built_categories == {"process", "network"}
    assert matched(Engine(cached, lazy=True)) == matched(eager)
    # the process rules' objects are never read until a process event: unreadable ones
    # do not stop the network category
    broken = forged(forged(cold, 0), 2)
    lazy = Engine(broken, lazy=True)
    assert [m.rule.id for m in lazy.evaluate(EVENTS[2:3])] == [cached.rules[1].id]


def test_a_compiled_cached_rule_drops_its_pysigma_object_and_reads_it_again_on_demand(
    tmp_path, rules_file
):
    cache = tmp_path / "hpcsec"
    first = load_rules([rules_file], with_tests=False, cache=cache)  # parsed, then cached
    assert not any(r.sigma_loaded for r in first.rules)  # returned as the cache holds them
    cached = load_rules([rules_file], with_tests=False, cache=cache)
    engine = Engine(cached)
    assert not any(r.sigma_loaded for r in cached.rules)  # the match functions need none
    cold = load_rules([rules_file], with_tests=False)
    Engine(cold)
    assert all(r.sigma_loaded for r in cold.rules)  # a parsed rule keeps its own
    (match,) = engine.evaluate(EVENTS[:1])
    assert match.rule.sigma == cold.rules[0].sigma and match.rule.sigma_loaded
    assert matched(engine) == matched(Engine(cold))


def test_the_bundled_rules_match_alike_lazily_from_the_cache_and_eagerly_cold(tmp_path):
    cache = tmp_path / "hpcsec"
    cold = load_rules(None, cache=cache)
    cached = load_rules(None, cache=cache)
    events = [e for t in cold.tests for e in (*t.match, *t.nomatch)]
    assert len(events) > 50

    def fired(engine: Engine) -> list[tuple[str, int]]:
        found = []
        for i, event in enumerate(events):
            found += [(m.rule.id, i) for m in engine.evaluate([event])]
        return sorted(found)

    placeholders = {"admins": ["adm"]}
    assert fired(Engine(cached, placeholders, lazy=True)) == fired(Engine(cold, placeholders))


def test_two_threads_building_one_category_share_one_function(rules_file):
    engine = Engine(load_rules([rules_file], with_tests=False), lazy=True)
    barrier = threading.Barrier(4)
    built = []

    def first_event() -> None:
        barrier.wait()
        built.append(engine._built("process"))

    threads = [threading.Thread(target=first_event) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(entry) for entry in built}) == 1 and built[0] is not None


def test_a_file_named_twice_through_a_link_loads_once_and_tests_dirs_are_skipped(
    tmp_path, rules_file
):
    other = tmp_path / "other"
    (other / "tests").mkdir(parents=True)
    (other / ".hidden").mkdir()
    os.link(rules_file, other / "same.yml")  # a hard link: one file, two names
    (other / "tests" / "x.yml").write_text("not a rule: [")
    (other / ".hidden" / "x.yml").write_text("not a rule: [")
    (other / "linked").symlink_to(tmp_path / "nowhere")  # dangling: not a rule file
    loaded = load_rules([rules_file, other], with_tests=False)
    assert [r.path for r in loaded.rules] == [str(rules_file)] * 3 and loaded.files == [
        str(rules_file)
    ]


@pytest.mark.parametrize("name", ["pySigma", "hpcsec", "PyYAML", "no-such-distribution-here"])
def test_the_cache_key_reads_versions_as_importlib_metadata_does(name):
    import importlib.metadata

    try:
        expected = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        expected = "-"
    assert rulecache.installed_version(name) == expected


def test_an_entry_made_here_is_the_one_its_bytes_read_back_with_objects_unread(tmp_path):
    """What the loading process keeps of a file it parsed for the cache (coldload's
    parse_entry_here) is what a later load reads from the cache: lazy rules, their errors
    and references alike."""
    from hpcsec.detector.engine.coldload import parse_entry_here

    path = tmp_path / "rules.yml"
    path.write_text(RULES + "---\ntitle: broken\nlogsource: {category: process}\ndetection: 5\n")
    data, here = parse_entry_here(path, None, None)
    assert data is not None and here is not None
    back = rulecache.decode_entry(data)
    assert back is not None
    assert not any(r.sigma_loaded for r in here.ruleset.rules)
    assert here.references == back.references
    assert [str(e) for e in here.ruleset.errors] == [str(e) for e in back.ruleset.errors]
    assert len(here.ruleset.errors) == 1 and f"{path}:" in str(here.ruleset.errors[0])
    assert here.ruleset.files == back.ruleset.files == [str(path)]
    assert here.ruleset.rules == back.ruleset.rules  # headers, places and pySigma objects
    assert [tuple(r.header) for r in here.ruleset.rules] == [
        tuple(r.header) for r in back.ruleset.rules
    ]


def test_a_scans_worker_sends_its_compile_errors_and_the_caller_logs_each_once(
    rules_file, tmp_path, caplog
):
    """A rule a lazy engine cannot compile is logged once by the scan, however many of its
    engines (its own, its workers') meet it: a worker's engine keeps the error quiet and
    sends it with the chunk."""
    from hpcsec.detector.runtime import chunk_detect

    broken = forged(load_rules([rules_file], with_tests=False), 0)
    engine = Engine(broken, lazy=True, lateness=None)
    detect = chunk_detect.Detect.of(broken, engine)
    assert detect is not None
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in EVENTS))
    size = events.stat().st_size
    chunk_detect._engines.clear()
    with caplog.at_level(logging.ERROR):
        chunk = chunk_detect.detect_chunk(str(events), 0, size, None, detect)  # as a worker
        assert "not evaluated" not in caplog.text  # the worker's engine logs nothing
        (message,) = chunk.compile_errors
        assert f"{rules_file}:1" in message and message.endswith("(the rule is not evaluated)")
        again = chunk_detect.detect_chunk(str(events), 0, size, None, detect)
        assert again.compile_errors == ()  # sent with the chunk that built the category
        chunk_detect.kept_of(chunk)  # the caller takes the chunk in: logged
        assert caplog.text.count("not evaluated") == 1
        chunk_detect.kept_of(chunk)
        matched(engine)  # the caller's own engine meets the same rule
    assert caplog.text.count("not evaluated") == 1
    assert engine.compile_errors == [message]
