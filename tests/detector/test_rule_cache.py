"""Rule sets cached on disk (engine/rulecache.py): keyed by content, private, self-healing."""

from __future__ import annotations

import os
from pathlib import Path

from hpcsec.detector.engine import rulecache
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


def stored(cache: Path, rules: Path) -> list[str]:
    """The keys of the entries in the pack of a load of `rules`, each one whole."""
    pack = rulecache.read(cache, [rules])
    assert None not in pack.values()
    return list(pack)


def names(ruleset) -> list[str]:
    return [
        str(r.sigma.detection.detections["sel"].detection_items[0].value[0]) for r in ruleset.rules
    ]


def test_second_load_reads_the_entry_and_any_change_makes_a_new_one(tmp_path):
    cache = tmp_path / "cache" / "hpcsec"
    rules = write_rule(tmp_path / "r.yml", "nc")
    first = load_rules([rules], with_tests=False, cache=cache)
    assert names(first) == ["nc"]
    assert [p.name for p in entries(cache)] == [rulecache.pack_name([rules])]
    assert cache.stat().st_mode & 0o777 == 0o700
    pack = entries(cache)[0]
    assert pack.stat().st_mode & 0o777 == 0o600
    assert len(stored(cache, rules)) == 1
    written = pack.stat().st_ino
    again = load_rules([rules], with_tests=False, cache=cache)
    assert names(again) == ["nc"] and len(entries(cache)) == 1
    assert pack.stat().st_ino == written  # read, not written again
    write_rule(rules, "ncat")  # a rule file change
    assert names(load_rules([rules], with_tests=False, cache=cache)) == ["ncat"]
    assert len(stored(cache, rules)) == 2  # the old entry is kept: an edit may be undone
    load_rules([rules], with_tests=False, cache=cache, threshold_values={"limit": 9})
    assert len(stored(cache, rules)) == 3  # and a threshold change: a key of its own
    assert len(entries(cache)) == 1  # all in the one pack of these rules


def test_a_corrupt_pack_is_ignored_and_rebuilt(tmp_path):
    cache = tmp_path / "hpcsec"
    rules = write_rule(tmp_path / "r.yml", "nc")
    load_rules([rules], with_tests=False, cache=cache)
    pack = entries(cache)[0]
    whole = pack.read_bytes()
    for damaged in (b"\x80\x05not a pack", b"", whole[:-1], whole + b"x", whole[:30]):
        pack.write_bytes(damaged)
        assert rulecache.read(cache, [rules]) == {}  # the index does not hold: no entry
        assert names(load_rules([rules], with_tests=False, cache=cache)) == ["nc"]
        assert pack.read_bytes() == whole  # rewritten whole


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
