"""Rule sets cached on disk (engine/rulecache.py): keyed by content, private, self-healing."""

from __future__ import annotations

import os
from pathlib import Path

from hpcsec.detector.engine.loader import load_rules

RULE = """title: cached
id: 0c0c0c0c-0000-4000-8000-000000000001
logsource: {product: hpc, category: process}
thresholds:
  limit: [detection, sel, 'process.pid|gt']
detection:
  sel:
    process.name: %s
    process.pid|gt: 3
  condition: sel
"""


def write_rule(path: Path, name: str) -> Path:
    path.write_text(RULE % name)
    return path


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith("."))


def names(ruleset) -> list[str]:
    return [
        str(r.sigma.detection.detections["sel"].detection_items[0].value[0]) for r in ruleset.rules
    ]


def test_second_load_reads_the_entry_and_any_change_makes_a_new_one(tmp_path):
    cache = tmp_path / "cache" / "hpcsec"
    rules = write_rule(tmp_path / "r.yml", "nc")
    first = load_rules([rules], with_tests=False, cache=cache)
    assert names(first) == ["nc"]
    assert len(entries(cache)) == 1
    assert cache.stat().st_mode & 0o777 == 0o700
    entry = entries(cache)[0]
    assert entry.stat().st_mode & 0o777 == 0o600
    again = load_rules([rules], with_tests=False, cache=cache)
    assert names(again) == ["nc"] and len(entries(cache)) == 1
    write_rule(rules, "ncat")  # a rule file change
    assert names(load_rules([rules], with_tests=False, cache=cache)) == ["ncat"]
    load_rules([rules], with_tests=False, cache=cache, threshold_values={"limit": 9})
    assert len(entries(cache)) == 3  # and a threshold change: a key of its own


def test_a_corrupt_entry_is_ignored_and_rebuilt(tmp_path):
    cache = tmp_path / "hpcsec"
    rules = write_rule(tmp_path / "r.yml", "nc")
    load_rules([rules], with_tests=False, cache=cache)
    entry = entries(cache)[0]
    entry.write_bytes(b"\x80\x05not a pickle")
    assert names(load_rules([rules], with_tests=False, cache=cache)) == ["nc"]
    assert entry.read_bytes().startswith(b"\x80")  # rewritten whole
    assert names(load_rules([rules], with_tests=False, cache=cache)) == ["nc"]
    entry.write_bytes(b"")  # truncated
    assert names(load_rules([rules], with_tests=False, cache=cache)) == ["nc"]
    assert entry.stat().st_size > 0


def test_a_cache_that_is_not_private_or_is_a_symlink_is_not_used(tmp_path):
    rules = write_rule(tmp_path / "r.yml", "nc")
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert names(load_rules([rules], with_tests=False, cache=link)) == ["nc"]
    assert list(target.iterdir()) == []  # never written through the link
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert names(load_rules([rules], with_tests=False, cache=shared)) == ["nc"]
    assert list(shared.iterdir()) == []
    owned = tmp_path / "owned"
    owned.mkdir(mode=0o700)
    os.chown(owned, 1, 1)  # another user's directory
    assert names(load_rules([rules], with_tests=False, cache=owned)) == ["nc"]
    assert list(owned.iterdir()) == []
